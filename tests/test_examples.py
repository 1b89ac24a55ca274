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
