"""A griffe extension: a class or function whose docstring is completed when its module is
imported gets the whole text on its page, as `help()` shows it.

`fitjax.Trainer`, its `plan` and its `generate` are decorated with
`fitjax.loop._trainer_doc.with_arguments`: their Args sections live in that module, beside the
loop rather than in it. griffe reads the source, where only the written part is; this takes the
imported object's text instead wherever the two differ (nowhere else in fitjax). Loaded by
mkdocstrings (`extensions:` in mkdocs.yml), before the doctest fences.
"""

from __future__ import annotations

import inspect

import griffe


class ImportedDocs(griffe.Extension):
    """The imported class's or function's docstring, where its source's differs from it."""

    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is None or not (obj.is_class or obj.is_function):
            return
        try:
            imported = griffe.dynamic_import(obj.path)
        except ImportError:  # made inside a function, or in a module that cannot be imported here
            return
        doc = imported.__dict__.get("__doc__") if inspect.isclass(imported) else getattr(imported, "__doc__", None)
        if isinstance(doc, str) and inspect.cleandoc(doc) != obj.docstring.value:
            obj.docstring.value = inspect.cleandoc(doc)
