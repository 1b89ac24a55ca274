"""CSVLogger: metrics.csv and hparams.yaml, read back with the csv and yaml readers."""

import csv
from pathlib import Path

import pytest
import yaml

from fitjax.loggers import CSVLogger
from fitjax.loggers import _csv


def _rows(run_dir: Path) -> tuple[list[str], list[dict[str, str]]]:
    with (run_dir / "metrics.csv").open(newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


def test_one_row_per_step_and_columns_that_grow(tmp_path):
    logger = CSVLogger(tmp_path)
    logger.log_metrics({"train/loss": 2.0, "lr": 0.1}, step=10)
    logger.log_metrics({"train/loss": 1.25, "lr": 0.05}, step=20)
    logger.log_metrics({"val/loss": 1.5, "val/acc": 1 / 3}, step=20)  # same step: same row
    logger.log_metrics({"train/loss": 0.5}, step=30)
    logger.finalize("success")

    header, rows = _rows(tmp_path / "fitjax_logs" / "version_0")
    assert header == ["step", "train/loss", "lr", "val/loss", "val/acc"]
    assert rows == [
        {"step": "10", "train/loss": "2.0", "lr": "0.1", "val/loss": "", "val/acc": ""},
        {"step": "20", "train/loss": "1.25", "lr": "0.05", "val/loss": "1.5", "val/acc": repr(1 / 3)},
        {"step": "30", "train/loss": "0.5", "lr": "", "val/loss": "", "val/acc": ""},
    ]
    assert float(rows[1]["val/acc"]) == 1 / 3  # full precision


def test_rows_are_buffered_and_the_file_is_rewritten_only_when_its_header_widens(tmp_path, monkeypatch):
    rewrites = []
    real_rewrite = _csv._rewrite
    monkeypatch.setattr(_csv, "_rewrite", lambda *a, **k: (rewrites.append(a[1]), real_rewrite(*a, **k)))
    logger = CSVLogger(tmp_path, flush_every_n_rows=2)
    for step in range(1, 7):
        logger.log_metrics({"loss": float(step)}, step=step)
    logger.log_metrics({"acc": 0.5}, step=6)
    logger.log_metrics({"loss": 7.0}, step=7)
    run_dir = logger.log_dir
    _, rows = _rows(run_dir)
    assert [r["step"] for r in rows] == ["1", "2", "3", "4", "5", "6"]  # the newest row is buffered
    logger.save()
    logger.log_metrics({"acc": 0.75}, step=7)  # the step already on disk: completed in place
    logger.finalize("success")
    logger.finalize("success")

    header, rows = _rows(run_dir)
    assert header == ["step", "loss", "acc"]
    assert [(r["step"], r["loss"], r["acc"]) for r in rows] == [
        ("1", "1.0", ""), ("2", "2.0", ""), ("3", "3.0", ""), ("4", "4.0", ""),
        ("5", "5.0", ""), ("6", "6.0", "0.5"), ("7", "7.0", "0.75"),
    ]  # fmt: skip
    # Only the first write and the widened header rewrote the file; step 7 was replaced in place.
    assert rewrites == [["loss"], ["loss", "acc"]]


def test_hparams_yaml_keeps_nesting_and_stringifies_what_yaml_cannot_hold(tmp_path):
    logger = CSVLogger(tmp_path, name="exp", version="baseline")
    logger.log_hyperparams({"lr": 1e-3, "model": {"sizes": (64, 64), "act": max}, "path": tmp_path, "x": None})
    assert yaml.safe_load((tmp_path / "exp" / "baseline" / "hparams.yaml").read_text()) == {
        "lr": 1e-3,
        "model": {"sizes": [64, 64], "act": "<built-in function max>"},
        "path": str(tmp_path),
        "x": None,
    }


def test_versions_count_up_and_can_be_given(tmp_path):
    loggers = [CSVLogger(tmp_path), CSVLogger(tmp_path), CSVLogger(tmp_path, version=5)]
    for logger in loggers:
        logger.log_metrics({"loss": 1.0}, step=0)
        logger.finalize("success")
    assert [logger.version for logger in loggers] == [0, 1, 5]
    folders = sorted(p.name for p in (tmp_path / "fitjax_logs").iterdir())
    assert folders == ["version_0", "version_1", "version_5"]
    assert CSVLogger(tmp_path).log_dir == tmp_path / "fitjax_logs" / "version_6"


def test_resume_drops_rows_past_the_checkpoint_and_keeps_the_columns(tmp_path):
    logger = CSVLogger(tmp_path)
    logger.log_metrics({"loss": 1.0, "acc": 0.1}, step=1)
    logger.log_metrics({"loss": 0.9}, step=2)
    state = logger.state_dict()
    logger.log_metrics({"loss": 99.0}, step=3)  # lost with the crash: past the checkpoint
    logger.finalize("failed")

    resumed = CSVLogger(tmp_path)
    resumed.load_state_dict(state)
    resumed.log_metrics({"loss": 0.8, "lr": 0.01}, step=3)
    resumed.finalize("success")

    header, rows = _rows(resumed.log_dir)
    assert resumed.log_dir == logger.log_dir
    assert header == ["step", "loss", "acc", "lr"]
    assert [(r["step"], r["loss"]) for r in rows] == [("1", "1.0"), ("2", "0.9"), ("3", "0.8")]


def test_a_process_other_than_zero_writes_nothing(tmp_path):
    logger = CSVLogger(tmp_path, process_index=3)
    logger.log_hyperparams({"lr": 0.1})
    logger.log_metrics({"loss": 1.0}, step=0)
    logger.save()
    logger.finalize("success")
    assert list(tmp_path.iterdir()) == []


def test_finalize_before_anything_was_logged_creates_nothing(tmp_path):
    logger = CSVLogger(tmp_path)
    logger.finalize("interrupted")
    logger.finalize("interrupted")
    assert list(tmp_path.iterdir()) == []


def test_a_metric_named_step_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"got the key 'step'.*Rename that metric"):
        CSVLogger(tmp_path).log_metrics({"step": 1.0}, step=0)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"flush_every_n_rows": 0}, r"CSVLogger\(flush_every_n_rows=\.\.\.\)` must be an int >= 1; got 0"),
        ({"version": True}, r"CSVLogger\(version=\.\.\.\)` must be None .* got True"),
    ],
)
def test_bad_arguments_are_named_in_the_error(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        CSVLogger(tmp_path, **kwargs)
