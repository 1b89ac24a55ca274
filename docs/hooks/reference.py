"""The API reference: one page per public name, generated when the site builds.

The public names are `fitjax.__all__` and the `__all__` of every subpackage `fitjax.__all__`
lists, read from the imported package, so a name added to an `__all__` gets its page by itself
and a name whose object mkdocstrings cannot find fails the (strict) build. An object exported
under several names (`fitjax.ModelCheckpoint` is `fitjax.callbacks.ModelCheckpoint`) gets one
page, under its shortest name, that lists the others. Used by mkdocs (`hooks:` in mkdocs.yml)
and by `tests/docs/`.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
from typing import Any

REFERENCE_DIR = "reference"


@dataclasses.dataclass(frozen=True)
class Entry:
    """One documented object: its public names (the first names its page) and where it lives."""

    names: tuple[str, ...]
    target: str  # the defining module's path: what mkdocstrings renders
    kind: str  # "class", "function" or "value"

    @property
    def name(self) -> str:
        return self.names[0]

    @property
    def page(self) -> str:
        return f"{REFERENCE_DIR}/{self.name}.md"


def public_modules() -> list[str]:
    """`fitjax` and the subpackages its `__all__` lists, in that order."""
    fitjax = importlib.import_module("fitjax")
    subs = [f"fitjax.{n}" for n in fitjax.__all__ if inspect.ismodule(getattr(fitjax, n))]
    return ["fitjax", *subs]


def _target(obj: Any, public: str) -> tuple[str, str]:
    if inspect.isclass(obj):
        return f"{obj.__module__}.{obj.__qualname__}", "class"
    if inspect.isfunction(obj):
        return f"{obj.__module__}.{obj.__qualname__}", "function"
    return public, "value"


def public_entries() -> list[Entry]:
    """Every public object once, in the order `public_modules()` and their `__all__` give."""
    names: dict[int, list[str]] = {}
    objects: dict[int, Any] = {}
    for module_name in public_modules():
        module = importlib.import_module(module_name)
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.ismodule(obj):
                continue
            names.setdefault(id(obj), []).append(f"{module_name}.{name}")
            objects[id(obj)] = obj
    entries = []
    for key, public in names.items():
        target, kind = _target(objects[key], public[0])
        entries.append(Entry(tuple(public), target, kind))
    return entries


def obj_of(entry: Entry) -> Any:
    """The object an entry documents, imported through its first public name."""
    module, _, name = entry.name.rpartition(".")
    return getattr(importlib.import_module(module), name)


def first_sentence(entry: Entry) -> str:
    """The first paragraph of the object's own docstring (a class's is not inherited), one line."""
    obj = obj_of(entry)
    doc = obj.__dict__.get("__doc__") if inspect.isclass(obj) else getattr(obj, "__doc__", None)
    return " ".join(inspect.cleandoc(doc or "").split("\n\n")[0].split())


def mixed_in(entry: Entry) -> list[str]:
    """The public members a class takes from the mixins it is built of (its bases named
    `...Mixin`, such as `LitModule`'s `WeightsMixin`: parts of the class, with no page of their
    own), which its page lists with its own (mkdocstrings shows no inherited member unless told)."""
    obj = obj_of(entry)
    if not inspect.isclass(obj):
        return []
    return sorted({name for base in obj.__bases__ if base.__name__.endswith("Mixin")
                   for name in vars(base) if not name.startswith("_") and name not in vars(obj)})


def _entry_page(entry: Entry) -> str:
    also = ""
    if len(entry.names) > 1:
        also = "Also importable as " + ", ".join(f"`{n}`" for n in entry.names[1:]) + ".\n\n"
    inherited = mixed_in(entry)
    return (
        f"# {entry.name}\n\n{also}"
        f"::: {entry.target}\n"
        f"    options:\n"
        f"      show_root_full_path: false\n"
        f"      heading_level: 2\n"
        + (f"      inherited_members: [{', '.join(inherited)}]\n" if inherited else "")
    )


def _module_page(module_name: str, entries: list[Entry], modules: list[str]) -> str:
    module = importlib.import_module(module_name)
    summary = (inspect.getdoc(module) or "").split("\n\n")[0]
    lines = [f"# {module_name}", "", summary, "", "| name | what it is |", "|---|---|"]
    by_name = {n: e for e in entries for n in e.names}
    for name in module.__all__:
        full = f"{module_name}.{name}"
        if full in modules:
            doc = (inspect.getdoc(importlib.import_module(full)) or "").split("\n")[0]
            lines.append(f"| [`{full}`]({full}.md) | {doc} |")
        else:
            entry = by_name[full]
            doc = (inspect.getdoc(getattr(module, name)) or "").split("\n")[0].replace("|", "\\|")
            lines.append(f"| [`{name}`]({entry.name}.md) | {doc} |")
    return "\n".join(lines) + "\n"


def pages() -> dict[str, str]:
    """Every reference page: its path under docs/ -> its Markdown."""
    modules = public_modules()
    entries = public_entries()
    out = {f"{REFERENCE_DIR}/index.md": _module_page("fitjax", entries, modules)}
    for module_name in modules[1:]:
        out[f"{REFERENCE_DIR}/{module_name}.md"] = _module_page(module_name, entries, modules)
    for entry in entries:
        out[entry.page] = _entry_page(entry)
    return out


_CODE = re.compile(r"(?<![\[\w])`(?P<text>(?:fj|fitjax)\.(?P<path>[A-Za-z_][\w.]*)(?P<call>\([^`]*\))?)`")


def link_public_names(markdown: str, targets: dict[str, str]) -> str:
    """Inline code naming a public object (`fj.ModelCheckpoint`, `fitjax.strategies.FSDP(...)`)
    becomes a cross-reference to its API entry (`targets`: public name -> the entry's anchor,
    its defining path); fenced blocks and code already linked stay.

    Example:
        >>> link_public_names("Use `fj.EMA(decay=0.9)`.", {"fitjax.EMA": "fitjax.callbacks.ema.EMA"})
        'Use [`fj.EMA(decay=0.9)`][fitjax.callbacks.ema.EMA].'
    """
    out, fenced = [], False
    for line in markdown.split("\n"):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if not fenced:
            def link(match: re.Match) -> str:
                target = targets.get(f"fitjax.{match.group('path')}")
                return f"[`{match.group('text')}`][{target}]" if target else match.group(0)

            line = _CODE.sub(link, line)
        out.append(line)
    return "\n".join(out)


# mkdocs hooks ------------------------------------------------------------------------------

_PAGES: dict[str, str] = {}
_TARGETS: dict[str, str] = {}


def on_config(config):
    _PAGES.clear()
    _PAGES.update(pages())
    _TARGETS.clear()
    _TARGETS.update({name: entry.target for entry in public_entries() for name in entry.names})
    modules = public_modules()
    entries = public_entries()
    top = [{e.name: e.page} for e in entries if e.name.count(".") == 1]
    section = [{"fitjax": [{"fitjax": f"{REFERENCE_DIR}/index.md"}, *top]}]
    for module in modules[1:]:
        inside = [{e.name: e.page} for e in entries if e.name.rsplit(".", 1)[0] == module]
        section.append({module: [{module: f"{REFERENCE_DIR}/{module}.md"}, *inside]})
    config["nav"].append({"API reference": section})
    return config


def on_files(files, config):
    from mkdocs.structure.files import File

    for path, content in _PAGES.items():
        files.append(File.generated(config, path, content=content))
    return files


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri.startswith(f"{REFERENCE_DIR}/"):
        return markdown
    return link_public_names(markdown, _TARGETS)
