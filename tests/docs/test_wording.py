"""README and the guides speak of the product, not of when they were written: a figure names its
command and the commit or date it was measured at, never "this stop", "last session", "today"."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

# Words that date a sentence by the work that wrote it ("stop", "session", "round": a stretch of
# that work). A training stop is the product's ("a stop request", "the stop's checkpoint"), so
# "stop" is caught only where it is a time: after this/last/previous/next/that, as "a stop
# later", or as the owner of code, changes, a note or main.
WHEN = re.compile(
    r"\b(?:this|last|previous|next|that) (?:stop|session|round)\b"
    r"|\ba (?:stop|session|round) (?:later|earlier|before|ago)\b"
    r"|\b(?:stop|session|round)'s (?:main|code|last code|changes|note|start|end of work)\b"
    r"|\b(?:today|yesterday|tonight)\b"
    r"|\bnot re-?measured\b",
    re.IGNORECASE)


def when_words(text: str) -> list[str]:
    """Each line of `text` holding a word that dates it, as `line number: line`."""
    return [f"{number}: {line.strip()}" for number, line in enumerate(text.splitlines(), 1) if WHEN.search(line)]


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_no_page_says_when_it_was_written(page):
    assert when_words(page.read_text()) == []


@pytest.mark.parametrize("line", [
    "W&B, the docs tools, Ray Train: 2.7 GB measured last stop) and what they compare with",
    "Lightning 2.6, torchmetrics, qwix and libtpu (added this stop, not re-measured).",
    "1.20x), tiny MLP 2.94x (2.39x). On this stop's main (CPU programs at LLVM level 2),",
    "(C functions included): all off 47.0, +bar 50.3 (55.7 before this stop's changes)",
    "The same command on the stop's last code (`b99889b`: the plain-line change)",
    "The same command alone on the machine (a stop later, load average 0.7 at the start)",
    "machine than the last measurement said (the code of the session's start measures 0.84x)",
    "examples/configs/gpt.yaml`, today, on the shared 2-core machine).",
])
def test_the_check_rejects_lines_that_said_when(line):
    assert when_words(line) == [f"1: {line}"]


@pytest.mark.parametrize("line", [
    "validation when a stop that will be obeyed is requested at an epoch's last batch,",
    "fitjax saves the stop's checkpoint without validating or ending the epoch",
    "A stop between two batches leaves the epoch open (fitjax does better here).",
    "The same command at `b99889b` (the plain-line change), load average 1.00 at the start",
])
def test_the_check_leaves_the_products_own_stops(line):
    assert when_words(line) == []


def test_the_throughput_flops_are_described_as_the_models():
    """Since the planner's model FLOPs, `train/device/flops_per_sec` is the model's count
    (`flops_per_batch`, 6N + attention, else XLA's); XLA's count of the step as it runs is
    `hardware_flops_per_sec`. The guides said otherwise."""
    callbacks = (ROOT / "docs" / "guides" / "callbacks.md").read_text()
    gpt = " ".join((ROOT / "docs" / "guides" / "gpt.md").read_text().split())
    readme = (ROOT / "README.md").read_text()
    assert "no `flops_per_batch` to write" not in callbacks
    assert "`train/device/flops_per_sec` (XLA's" not in gpt
    assert "yes, FLOPs from XLA's count of the compiled step" not in readme
    assert "6N + attention" in callbacks and "hardware_flops_per_sec" in callbacks
    assert "hardware_flops_per_sec" in gpt
