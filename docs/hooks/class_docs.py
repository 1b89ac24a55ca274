"""A griffe extension: a class whose docstring is completed when the class is made gets the whole
text on its page, as `help()` shows it.

`fitjax.Trainer` writes `__doc__ = _trainer_doc.with_arguments(__doc__)`: the reference of its
arguments lives in `fitjax/loop/_trainer_doc.py`, beside the loop rather than in it. griffe reads
the source, where only the written part is; this takes the imported class's text instead
wherever the two differ. Loaded by mkdocstrings (`extensions:` in mkdocs.yml), before the
doctest fences.
"""

from __future__ import annotations

import inspect

import griffe


class ClassDocs(griffe.Extension):
    """The imported class's docstring, where its source's differs from it."""

    def on_class_members(self, *, cls: griffe.Class, **kwargs) -> None:
        if cls.docstring is None:
            return
        try:
            doc = griffe.dynamic_import(cls.path).__dict__.get("__doc__")
        except ImportError:  # a class made inside a function, or a module that cannot be imported here
            return
        if isinstance(doc, str) and inspect.cleandoc(doc) != cls.docstring.value:
            cls.docstring.value = inspect.cleandoc(doc)
