"""A griffe extension: the `>>>` examples of docstrings become highlighted `pycon` code blocks.

Google-style docstrings write examples as doctest lines, which Markdown would read as nested
block quotes. Each run of lines that starts with `>>>` (its `...` continuations and the output
lines after it, up to a blank line) is fenced, at its own indentation. Loaded by mkdocstrings
(`extensions:` in mkdocs.yml).
"""

from __future__ import annotations

import re

import griffe

_PROMPT = re.compile(r"^(\s*)>>>( |$)")


def fence_doctests(text: str) -> str:
    """`text` with every doctest run wrapped in a ```pycon fence.

    Example:
        >>> print(fence_doctests(">>> 1 + 1\\n2"))
        ```pycon
        >>> 1 + 1
        2
        ```
    """
    lines, out, i, fenced = text.split("\n"), [], 0, False
    while i < len(lines):
        if lines[i].strip().startswith("```"):
            fenced = not fenced  # a block the author fenced already stays as written
        match = _PROMPT.match(lines[i])
        if fenced or not match:
            out.append(lines[i])
            i += 1
            continue
        indent = match.group(1)
        out.append(f"{indent}```pycon")
        while i < len(lines) and lines[i].strip() and lines[i].startswith(indent):
            out.append(lines[i])
            i += 1
        out.append(f"{indent}```")
    return "\n".join(out)


class DoctestFences(griffe.Extension):
    """Fences the doctest examples of every docstring griffe loads."""

    def on_object(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is not None and ">>>" in obj.docstring.value:
            obj.docstring.value = fence_doctests(obj.docstring.value)
