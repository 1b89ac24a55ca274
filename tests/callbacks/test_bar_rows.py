"""The progress bar's rows (`fitjax.callbacks._bar_rows.BarRows`) look as rich's own `Progress`
table draws them, at a quarter of its cost: checked against rich itself, on the same tasks."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from fitjax.callbacks import _bar_rows
from fitjax.callbacks._bar_rows import BarRows

# rich's columns as the bar had them before it drew its own rows
_RICH_COLUMNS = (TextColumn("[bold]{task.description}"), BarColumn(bar_width=None), MofNCompleteColumn(),
                 TimeElapsedColumn(), TextColumn("{task.fields[eta]}"), TextColumn("{task.fields[speed]}"))

TRAIN = ("Epoch 1/2", 1024, 517, "0:00:01", "9000.1 it/s")  # a half bar at the end of the done part
TRAIN_START = ("Epoch 0/9", 10, 0, "-:--:--", "- it/s")
TRAIN_DONE = ("Epoch 9/9", 10, 10, "0:00:00", "12.0 it/s")
TRAIN_SLOW = ("Epoch 12/99", 333, 100, "0:01:01", "1.50 s/it")
VALIDATION = ("Validation", 7, 3, "", "")


def _progress(console: Console, tasks) -> Progress:
    progress = Progress(*_RICH_COLUMNS, console=console, auto_refresh=False)
    for description, total, done, eta, speed in tasks:
        progress.add_task(description, total=total, completed=done, eta=eta, speed=speed)
    return progress


def _drawn(tasks, width: int, *, ours: bool, **console_kwargs) -> str:
    console = Console(file=io.StringIO(), force_terminal=True, width=width, **console_kwargs)
    progress = _progress(console, tasks)
    console.print(BarRows(progress.tasks) if ours else progress.make_tasks_table(progress.tasks))
    return console.file.getvalue()


@pytest.mark.parametrize("width", [80, 100, 137])
@pytest.mark.parametrize("tasks", [[TRAIN], [TRAIN_START], [TRAIN_DONE], [TRAIN_SLOW], [TRAIN, VALIDATION]],
                         ids=["half", "start", "done", "slow", "with-validation"])
def test_training_rows_are_richs_rows(tasks, width):
    ours, rich = _drawn(tasks, width, ours=True), _drawn(tasks, width, ours=False)
    assert Text.from_ansi(ours).plain == Text.from_ansi(rich).plain
    # and the same colours: rich's theme styles (it splits a bar into more escape runs)
    assert set(re.findall(r"\x1b\[[\d;]*m", ours)) == set(re.findall(r"\x1b\[[\d;]*m", rich))


def test_rows_fill_the_width_align_their_columns_and_keep_numbers_whole():
    for width in (80, 50):
        lines = Text.from_ansi(_drawn([TRAIN, VALIDATION], width, ours=True)).plain.splitlines()
        assert [len(line) for line in lines] == [width, width]
        assert lines[0].index("0:00:00") == lines[1].index("0:00:00")  # the elapsed times, one column
        assert "…" not in "".join(lines)  # rich's table cuts the numbers at 50 columns ("517…")
    drawn = Text.from_ansi(_drawn([TRAIN], 50, ours=True)).plain
    assert drawn.endswith(" 517/1024 0:00:00 0:00:01 9000.1 it/s\n")  # the bar gives way first


def _segments(tasks, *, encoding: str = "utf-8"):
    console = Console(file=io.StringIO(), force_terminal=True, width=80, color_system="truecolor")
    progress = _progress(console, tasks)
    options = console.options.copy()
    options.encoding = encoding
    return console, list(console.render(BarRows(progress.tasks), options))


def test_the_bar_is_done_in_proportion_in_richs_styles():
    console, segments = _segments([TRAIN_DONE])
    assert any(s.text.startswith("━") and s.style == console.get_style("bar.finished") for s in segments)
    console, segments = _segments([TRAIN])
    done = "".join(s.text for s in segments if s.style == console.get_style("bar.complete"))
    back = "".join(s.text for s in segments if s.style == console.get_style("bar.back"))
    halves = int((len(done) + len(back)) * 2 * 517 / 1024)
    assert done == "━" * (halves // 2) + "╸" * (halves % 2)
    assert back == ("╺" if halves % 2 == 0 else "━") + "━" * (len(back) - 1)


def test_without_colours_only_the_done_part_shows_and_ascii_terminals_get_dashes():
    no_colour = Text.from_ansi(_drawn([TRAIN], 80, ours=True, no_color=True)).plain
    assert re.search(r"━ {10,} 517/1024", no_colour)  # rich draws no back bar without colours
    assert no_colour == Text.from_ansi(_drawn([TRAIN], 80, ours=False, no_color=True)).plain
    _, segments = _segments([TRAIN], encoding="ascii")
    text = "".join(s.text for s in segments)
    assert not re.search("[━╸╺]", text) and re.search(r"-{10,}", text)


def test_a_task_of_unknown_length_pulses(monkeypatch):
    starts = []
    for now in (0.0, 0.5, 1.0):
        monkeypatch.setattr(_bar_rows.time, "monotonic", lambda now=now: now)
        console, segments = _segments([("Epoch 0", None, 5, "", "")])
        pulse = [i for i, s in enumerate(segments) if s.style == console.get_style("bar.pulse")]
        assert len(pulse) == 1 and set(segments[pulse[0]].text) == {"━"}
        starts.append(sum(len(s.text) for s in segments[:pulse[0]]))
    assert starts[0] < starts[1] < starts[2]  # the run crosses the bar
    assert "5/?" in "".join(s.text for s in segments)
