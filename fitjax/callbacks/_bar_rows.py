"""The progress bar's rows, drawn as one `rich.text.Text`: what rich's `Progress` draws with a
table of columns (description, bar, done/total, elapsed, time left, speed), at a quarter of
its cost.

A redraw through rich's table layout costs ~0.65 ms of CPU; on a model whose epochs last a
tenth of a second the clocked redraws alone were ~2% of the training loop
(`benchmarks/overhead.py --only tiny`). Built here as styled runs of one text, the same rows
cost ~0.15 ms. The look is rich's: its bar characters and theme styles (`bar.complete`,
`bar.back`, `bar.finished`, `progress.download`, `progress.elapsed`), each column as wide as
its widest cell, one space between columns, the bar taking the width the others leave.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any, Iterable

from rich.console import Console, ConsoleOptions, RenderResult
from rich.text import Text

__all__ = ["BarRows"]

_PULSE_S = 2.0  # the time a pulse (a task of unknown length) takes to cross its bar


def _elapsed(task: Any) -> str:
    elapsed = task.finished_time if task.finished else task.elapsed
    return "-:--:--" if elapsed is None else str(timedelta(seconds=max(0, int(elapsed))))


def _count(task: Any) -> str:
    """`completed/total`, the count padded to the total's width (`  7/100`); `?` for no total."""
    total = "?" if task.total is None else str(int(task.total))
    return f"{int(task.completed):{len(total)}d}/{total}"


def _cells(task: Any) -> tuple[str, str, str, str, str]:
    """A task's text columns: description, count, elapsed, time left, speed."""
    fields = task.fields
    return task.description, _count(task), _elapsed(task), fields.get("eta", ""), fields.get("speed", "")


class BarRows:
    """The visible tasks of a `rich.progress.Progress` as rows of one text, at the width the
    console gives (`options.max_width`); a row wider than that is cropped."""

    def __init__(self, tasks: Iterable[Any]) -> None:
        self.tasks = [task for task in tasks if task.visible]

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if not self.tasks:
            return
        cells = [_cells(task) for task in self.tasks]
        widths = [max(len(row[i]) for row in cells) for i in range(5)]
        bar_width = max(0, options.max_width - sum(widths) - 5)  # one space between 6 columns
        ascii_only = options.ascii_only or options.legacy_windows
        back = console.color_system is not None and not console.no_color  # rich's: no colors, no back bar
        text = Text(no_wrap=True, overflow="crop")
        for i, (task, row) in enumerate(zip(self.tasks, cells)):
            if i:
                text.append("\n")
            text.append(row[0], "bold")
            text.append(" " * (widths[0] - len(row[0]) + 1))
            _append_bar(text, task, bar_width, ascii_only=ascii_only, back=back)
            text.append(" ")
            text.append(row[1].ljust(widths[1]), "progress.download")
            text.append(" ")
            text.append(row[2].ljust(widths[2]), "progress.elapsed")
            text.append(f" {row[3].ljust(widths[3])} {row[4].ljust(widths[4])}")
        yield text


def _append_bar(text: Text, task: Any, width: int, *, ascii_only: bool, back: bool) -> None:
    """`task`'s bar, `width` columns, as rich's `ProgressBar` draws it: whole bars and a half bar
    done, then the rest in the back style (a half bar first, facing the done part, when the
    done part ends on a whole column); a task of unknown length pulses (a moving run)."""
    bar, right_half, left_half = ("-", " ", " ") if ascii_only else ("━", "╸", "╺")
    if task.total is None:  # unknown length: a tenth of the bar crossing it
        run = max(1, width // 10)
        start = int((time.monotonic() % _PULSE_S) / _PULSE_S * width)
        before, during = min(start, width), min(run, width - start)
        background = bar if back else " "
        text.append(background * before, "bar.back")
        text.append(bar * during, "bar.pulse")
        text.append(background * (width - before - during), "bar.back")
        return
    done = min(task.total, max(0, task.completed))
    halves = int(width * 2 * done / task.total) if task.total else width * 2
    whole, half = divmod(halves, 2)
    text.append(bar * whole + right_half * half, "bar.finished" if task.completed >= task.total else "bar.complete")
    rest = width - whole - half
    if not back:
        text.append(" " * rest)
    elif rest:
        text.append((left_half + bar * (rest - 1)) if whole and not half else bar * rest, "bar.back")
