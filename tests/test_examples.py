"""The examples are programs users copy: each one runs here, end to end, to its stated bar."""

from __future__ import annotations

from pathlib import Path

import helpers  # noqa: F401  (first: it puts examples/ on the path)
import digits


def test_digits_example_data_parallel_reaches_95_percent(tmp_path):
    results = digits.main(["--strategy", "dp", "--epochs", "6", "--no-progress-bar", "--root-dir", str(tmp_path)])
    assert results["val/acc"] >= 0.95
    assert list(Path(tmp_path, "fitjax_logs", "version_0").glob("events.out.tfevents.*"))
