"""The metric log as a part of its own: built without a Trainer, its rows, reads and checkpoint
value; and, through a real fit, how far a train metric travels to the TensorBoard file."""

from __future__ import annotations

import csv
import traceback

import numpy as np
import pytest
import tensorboardX.writer

import fitjax as fj
from fitjax.loop.metric_log import EpochAccumulators, MetricLog
from fitjax.loop.progress import Progress, ProgressView
from fitjax.profilers import resolve_profiler
from fitjax.profilers._compile import CompileTimes

from helpers import Regressor, regression_data


def _log(loggers, progress):
    return MetricLog(loggers, profiler=resolve_profiler(None), compile_times=CompileTimes(),
                     progress=ProgressView(progress), on_window_logged=progress.logged)


def _rows(logger):
    logger.finalize("success")
    with open(logger.log_dir / "metrics.csv") as f:
        return list(csv.DictReader(f))


def test_rows_go_at_lightnings_step_in_and_out_of_fit_and_aliases_reach_only_callback_metrics(tmp_path):
    progress, logger = Progress(), fj.CSVLogger(tmp_path)
    log = _log([logger], progress)
    progress.global_step, progress.epoch = 6, 1
    log.log({"val/loss": 0.5}, aliases={"loss": 0.5})  # a validate() after fit: at global_step
    log.begin_fit({})
    log.log({"val/loss": 0.25}, progress_bar={"val/loss": 0.25})  # during fit: the last step taken
    log.end_fit()
    assert [(r["step"], r["val/loss"], r["epoch"]) for r in _rows(logger)] == [("6", "0.5", "1.0"), ("5", "0.25", "1.0")]
    assert log.callback_metrics == {"loss": 0.5, "val/loss": 0.25}
    assert log.logged_metrics == {"val/loss": 0.25} and log.progress_bar_metrics == {"val/loss": 0.25}


def test_epoch_accumulators_round_trip_through_json_meta_bitwise():
    acc = EpochAccumulators().merged({"train/loss": np.array([0.1 + 0.2, 3.0])}).merged(
        {"train/loss": np.array([1 / 3, 1.0]), "train/mae": np.array([2.5, 4.0])})
    back = EpochAccumulators.from_meta(acc.to_meta())
    assert back.acc.keys() == acc.acc.keys()
    for name in acc.acc:
        assert back.acc[name].dtype == np.float64
        np.testing.assert_array_equal(back.acc[name], acc.acc[name])


def _module_reentries(frames):
    files = [f.filename for f in frames]
    runs = [m for i, m in enumerate(files) if i == 0 or files[i - 1] != m]
    return len(runs) - len(set(runs))


_LOOP_FRAMES = ("train_batches", "end_epoch", "_validate_during_fit")  # the batch loop, the epoch's end, validation


@pytest.mark.parametrize("tag", ["train/mae", "val/loss", "lr"])
def test_a_logged_value_reaches_the_tensorboard_file_in_few_frames_and_modules(tmp_path, monkeypatch, tag):
    """Issue 24's and 35's measure: from the loop frame (the train step's or the validation's) to
    tensorboardX's `add_summary`, the stack of every row holding a value of `metrics`
    (`train/mae`), of an evaluation (`val/loss`) or of a callback (`lr`, `LearningRateMonitor`
    logging with `module.log`) is at most 12 frames in at most 6 modules, none entered twice
    (measured: 6 frames in 4 modules for `train/mae` within an epoch, 8 at its end)."""
    stacks = []
    add_summary = tensorboardX.writer.FileWriter.add_summary

    def spy(self, summary, global_step=None, walltime=None):
        if any(value.tag == tag for value in summary.value):
            stack = traceback.extract_stack()[:-1]
            loop = max(i for i, frame in enumerate(stack) if frame.name in _LOOP_FRAMES)
            stacks.append(stack[loop:] + [traceback.FrameSummary(tensorboardX.writer.__file__, 0, "add_summary")])
        return add_summary(self, summary, global_step, walltime)

    monkeypatch.setattr(tensorboardX.writer.FileWriter, "add_summary", spy)
    trainer = fj.Trainer(max_epochs=1, log_every_n_steps=2, default_root_dir=tmp_path, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False,
                         callbacks=[fj.LearningRateMonitor()])
    module = Regressor()
    module.lr_schedule = 0.05
    trainer.fit(module, fj.DataLoader(regression_data(n=64), batch_size=8),
                fj.DataLoader(regression_data(n=16, seed=1), batch_size=8))
    assert len(stacks) == {"train/mae": 4, "val/loss": 1, "lr": 4}[tag]  # rows at steps 1, 3, 5, 7
    for stack in stacks:
        where = [f"{frame.filename}:{frame.name}" for frame in stack]
        assert len(stack) <= 12 and len({frame.filename for frame in stack}) <= 6, where
        assert _module_reentries(stack) == 0, where
