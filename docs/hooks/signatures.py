"""Signatures in the API pages on several lines, one parameter a line, when they are longer than
the page's line (mkdocstrings' `separate_signature`): mkdocstrings formats them with Black or Ruff
when one is installed, else leaves them on one long line; this hook gives it a formatter of its own,
so the pages read the same with neither installed (no dependency for a line break)."""

from __future__ import annotations

try:  # mkdocstrings-python's formatter lookup: private, so a version without it keeps one line
    from mkdocstrings_handlers.python._internal import rendering
except ImportError:  # pragma: no cover - another mkdocstrings-python layout
    rendering = None

_OPEN, _CLOSE = "([{", ")]}"


def parameters(code: str) -> tuple[str, list[str], str]:
    """`"def f(a, b=(1, 2)) -> T: pass"` as `("def f(", ["a", "b=(1, 2)"], ") -> T: pass")`: split at
    the commas of the outer parentheses, never inside brackets or strings."""
    start = code.index("(")
    parts, depth, quote, begun, i = [], 0, None, start + 1, start
    while i < len(code):
        c = code[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif c in _OPEN:
            depth += 1
        elif c in _CLOSE:
            depth -= 1
            if depth == 0:
                parts.append(code[begun:i])
                break
        elif c == "," and depth == 1:
            parts.append(code[begun:i])
            begun = i + 1
        i += 1
    return code[: start + 1], [p.strip() for p in parts if p.strip()], code[i:]


def format_signature(code: str, line_length: int) -> str:
    """mkdocstrings' formatter contract: `code` is `def <name>(...) -> ...: pass`; returns it
    whole when it fits `line_length`, else one parameter a line (as Black would), ending in a
    newline."""
    if len(code) <= line_length:
        return code + "\n"
    head, params, tail = parameters(code)
    if not params:
        return code + "\n"
    return head + "\n" + "".join(f"    {p},\n" for p in params) + tail + "\n"


if rendering is not None and hasattr(rendering, "_get_formatter"):
    rendering._get_formatter = lambda: format_signature
