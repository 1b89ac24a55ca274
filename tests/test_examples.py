"""The examples are programs users copy: each one runs here, end to end, to its stated bar."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import helpers  # noqa: F401  (first: it puts examples/ on the path)
import digits


def test_digits_example_data_parallel_reaches_95_percent(tmp_path):
    results = digits.main(["--strategy", "dp", "--epochs", "6", "--no-progress-bar", "--root-dir", str(tmp_path)])
    assert results["val/acc"] >= 0.95
    assert list(Path(tmp_path, "fitjax_logs", "version_0").glob("events.out.tfevents.*"))


def test_imbalanced_digits_example_logs_macro_f1_and_auroc_and_keeps_the_best_f1(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    import imbalanced_digits

    results = imbalanced_digits.main(["--epochs", "3", "--no-progress-bar", "--root-dir", str(tmp_path)])
    found = results["metrics"]
    assert 0.9 <= found["val/auroc"] <= 1.0
    assert found["val/f1"] < found["val/acc"]  # the rare classes pull the macro F1 down
    events = EventAccumulator(str(results["log_dir"]), size_guidance={"scalars": 0, "images": 0})
    events.Reload()
    by_epoch = [e.value for e in events.Scalars("val/f1")]
    best = int(np.argmax(by_epoch))
    assert results["best_f1"] == pytest.approx(by_epoch[best])
    assert Path(results["best_model_path"]).name.startswith(f"epoch={best}-")
    assert "val/confusion" in events.Tags()["images"]


def test_the_digits_example_promises_the_figure_readme_and_the_docs_promise():
    """A newcomer reads the figure in three places; they must not disagree (they did: ~98% in the
    example, 99.4% in README)."""
    import re

    root = Path(__file__).resolve().parents[1]

    def figures(text: str) -> set[str]:
        return set(re.findall(r"(\d+\.\d)% val", text))

    example = figures(Path(digits.__file__).read_text())
    assert example, "examples/digits.py states no validation accuracy"
    for page in ("README.md", "docs/index.md"):
        line = next(l for l in (root / page).read_text().splitlines() if "python examples/digits.py" in l)
        assert figures(line) == example, f"{page} promises {figures(line)}, examples/digits.py {example}"
