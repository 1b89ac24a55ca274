"""`--help` within 80 columns: a parser of the classes' arguments has ~100 options, and argparse's
usage lists each (`[--trainer.reload_dataloaders_every_n_epochs RELOAD_DATALOADERS_EVERY_N_EPOCHS]`,
107 columns, 40 lines); the help below it lists them all again with their text. The usage keeps the
options of its own level and says where the rest are; group titles (a class's docstring's first
line) are folded to the width.
"""

from __future__ import annotations

import argparse
import shutil
import textwrap

__all__ = ["WIDTH", "folded_title", "short_usage"]

WIDTH = 80  # the most columns `--help` uses, whatever the terminal's width


def width() -> int:
    """Columns to fill: the terminal's (argparse's rule, 2 kept free), at most `WIDTH`."""
    return min(WIDTH, shutil.get_terminal_size().columns - 2)


def folded_title(title: str | None) -> str | None:
    """A group's title folded to the width (argparse prints titles as they are)."""
    if title is None or len(title) < width():
        return title
    return "\n".join(textwrap.wrap(title, width() - 1))  # the title is printed with a ':' after it


def short_usage(parser: argparse.ArgumentParser, usage: str) -> str:
    """`usage` as argparse formatted it, or, when one of its lines is wider than the width, the
    options without a `.` in their name and one `[--GROUP.ARGUMENT VALUE ...]` for the rest."""
    if all(len(line) <= width() for line in usage.splitlines()):
        return usage
    parts, nested = [], False
    for action in parser._actions:  # argparse's own list; there is no public accessor
        if not action.option_strings:
            continue
        name = max(action.option_strings, key=len)
        if "." in name:
            nested = True
            continue
        value = "" if action.nargs == 0 else f" {action.metavar or action.dest.upper()}"
        parts.append(f"[{min(action.option_strings, key=len)}{value}]")
    if nested:
        parts.append("[--GROUP.ARGUMENT VALUE ...]")
    head = f"usage: {parser.prog} "
    glued = " ".join(part.replace(" ", "\0") for part in parts)  # a part is never split over two lines
    lines = textwrap.wrap(glued, width(), initial_indent=head, subsequent_indent=" " * len("usage: "),
                          break_long_words=False, break_on_hyphens=False)
    return "\n".join(lines).replace("\0", " ") + "\n"
