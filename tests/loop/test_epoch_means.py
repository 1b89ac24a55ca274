"""An epoch's means are written at its end, with or without an `on_train_epoch_end` hook (the
loop waits for them: not waiting bought nothing measurable and mistimed the it/s): the rows,
`callback_metrics`, `logged_metrics` and the it/s are the same either way."""

from __future__ import annotations

import math
import time

import jax
import pytest

import fitjax as fj

from helpers import Regressor, Rows, quiet_trainer, regression_data


def _epoch_rows(rows):
    return [(step, {k: v for k, v in row.items() if not k.startswith("compile/")})
            for step, row in rows if "train/loss_epoch" in row]


class _AtNextEpoch(fj.Callback):
    """At epoch 1's start, before any step of it: the reads and the rows written so far."""

    def __init__(self, logger):
        self.logger = logger

    def on_train_epoch_start(self, trainer, module):
        if trainer.current_epoch == 1:
            self.rows = list(self.logger.rows)
            self.callback_metrics = dict(trainer.callback_metrics)
            self.logged_metrics = dict(trainer.logged_metrics)


class _AtEpochEnd(fj.Callback):
    """An `on_train_epoch_end` hook: the loop writes the epoch's rows before calling it."""

    def __init__(self, logger):
        self.logger = logger
        self.rows = []

    def on_train_epoch_end(self, trainer, module):
        self.rows.append(list(self.logger.rows))


def _fit(callback_cls, **kwargs):
    logger = Rows()
    callback = callback_cls(logger)
    kwargs.setdefault("log_every_n_steps", 3)
    trainer = quiet_trainer(max_epochs=3, strategy="single", logger=logger, callbacks=[callback], **kwargs)
    trainer.fit(Regressor(), fj.DataLoader(regression_data(), batch_size=32, shuffle=True))
    return trainer, logger, callback


def test_with_or_without_an_epoch_end_hook_the_means_are_written_at_the_epochs_end():
    hookless, hookless_rows, early = _fit(_AtNextEpoch)
    waited, waited_rows, at_end = _fit(_AtEpochEnd)
    # the same rows in the same order (values from the same seed and data, bitwise)
    strip = lambda rows: [(s, {k: v for k, v in r.items() if not k.startswith("compile/")}) for s, r in rows]
    assert strip(hookless_rows.rows) == strip(waited_rows.rows)
    assert [step for step, _ in _epoch_rows(hookless_rows.rows)] == [7, 15, 23]
    assert hookless.callback_metrics == waited.callback_metrics
    # with a hook the rows are written before it runs; without one, before the next epoch starts
    assert [len(_epoch_rows(rows)) for rows in at_end.rows] == [1, 2, 3]
    assert _epoch_rows(early.rows) == _epoch_rows(hookless_rows.rows)[:1]
    epoch0 = _epoch_rows(hookless_rows.rows)[0][1]
    assert early.callback_metrics["train/loss_epoch"] == epoch0["train/loss_epoch"]
    assert early.callback_metrics["train/loss"] != epoch0["train/loss_epoch"]  # the last step's, not the mean
    assert early.logged_metrics["train/mae_epoch"] == epoch0["train/mae_epoch"]


class _Clock(fj.Callback):
    """Epoch 1's start to the end of training (every step finished), and the it/s then."""

    def __init__(self, logger):
        self.rates = []

    def on_train_epoch_start(self, trainer, module):
        if trainer.current_epoch == 1:
            self.start, self.start_step = time.perf_counter(), trainer.global_step
        self.rates.append(trainer.progress.steps_per_second)

    def on_train_end(self, trainer, module):
        jax.block_until_ready(trainer.state)
        self.average = (trainer.global_step - self.start_step) / (time.perf_counter() - self.start)
        self.rates.append(trainer.progress.steps_per_second)


@pytest.mark.filterwarnings("ignore:The number of training batches")
def test_it_per_second_is_timed_at_each_epochs_end():
    _, _, clock = _fit(_Clock, log_every_n_steps=100)  # only the epochs' ends time steps
    # epoch 0's steps are timed at its end, where the loop waits for them
    assert clock.rates[0] is None and None not in clock.rates[1:], clock.rates
    assert all(math.isfinite(rate) and rate > 0 for rate in clock.rates[1:]), clock.rates
    # the speed of finished steps: of the order of the steps' average (a loaded machine moves it)
    assert clock.average / 10 < clock.rates[-1] < clock.average * 10, (clock.rates, clock.average)


@pytest.mark.filterwarnings("ignore:The number of training batches")
def test_a_failure_after_an_epoch_logs_that_epochs_means():
    class _Fails(fj.Callback):
        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            if trainer.current_epoch == 1 and batch_idx == 0:  # no step since epoch 0's end
                raise RuntimeError("stop here")

    logger = Rows()
    trainer = quiet_trainer(max_epochs=3, strategy="single", logger=logger, log_every_n_steps=100,
                            callbacks=[_Fails()])
    try:
        trainer.fit(Regressor(), fj.DataLoader(regression_data(), batch_size=32))
    except RuntimeError as err:
        assert "stop here" in str(err)
    else:
        raise AssertionError("the fit did not fail")
    assert [step for step, _ in _epoch_rows(logger.rows)] == [7]
