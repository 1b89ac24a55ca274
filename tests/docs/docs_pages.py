"""The Python code blocks of the Markdown pages, as the docs tests read them.

A block runs unless the nearest non-blank line above it is a marker, visible
`*Not run: <the reason>.*` or hidden `<!-- Not run: <the reason> -->` (the beginner's pages); a marked block that is an excerpt of an example (its reason names
`examples/<file>.py` and says "verbatim") must appear in that file as written.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[\w-]*)[^\n]*$")
# shown on the page, or (the beginner's pages) an HTML comment the reader does not see
_NOT_RUN = re.compile(r"^(?:\*Not run: (?P<reason>.+)\*|<!-- Not run: (?P<hidden>.+) -->)$")


@dataclasses.dataclass(frozen=True)
class Snippet:
    """One fenced `python` block: its code, the line it starts on, and why it is not run."""

    code: str
    line: int
    not_run: str | None  # the reason shown on the page, or None when the block runs


def pages() -> list[Path]:
    """README and every page of the site's sources (the generated API pages have no snippets)."""
    return [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md") if "hooks" not in p.relative_to(ROOT).parts)]


def python_snippets(text: str) -> list[Snippet]:
    """The `python` blocks of a Markdown text, in page order, less their fence's indentation."""
    lines, snippets, i = text.split("\n"), [], 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        start, indent = i, fence.group("indent")
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            i += 1
        if fence.group("lang") == "python":
            body = "".join(ln.removeprefix(indent) + "\n" for ln in lines[start + 1 : i])
            above = next((ln.strip() for ln in reversed(lines[:start]) if ln.strip()), "")
            marker = _NOT_RUN.match(above)
            snippets.append(Snippet(body, start + 1, (marker.group("reason") or marker.group("hidden")) if marker else None))
        i += 1
    return snippets
