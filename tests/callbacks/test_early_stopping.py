"""EarlyStopping on a module whose validation metric follows a script, one value per epoch."""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import Regressor, quiet_trainer, regression_data

import fitjax as fj


class ScoredRegressor(Regressor):
    """Reports the batch's `score` column as a metric: the data decides what validation sees."""

    def metrics(self, batch, outputs):
        return {"score": batch["score"].mean()}


class ScriptedVal:
    """A validation set whose `score` is the next value of `scores` each time it is iterated."""

    def __init__(self, scores):
        self.scores = list(scores)
        self.epochs = 0

    def __len__(self):
        return 1

    def __iter__(self):
        score = self.scores[self.epochs]
        self.epochs += 1
        yield {**regression_data(n=16, seed=1), "score": np.full((16,), score, np.float32)}


def _fit(stopper, scores, max_epochs=10):
    train = {**regression_data(n=32), "score": np.zeros((32,), np.float32)}
    # no sanity check: it would draw the first scripted score
    trainer = quiet_trainer(max_epochs=max_epochs, strategy="single", callbacks=[stopper], num_sanity_val_steps=0)
    trainer.fit(ScoredRegressor(), fj.DataLoader(train, batch_size=16), ScriptedVal(scores))
    return trainer


@pytest.mark.parametrize(
    "kwargs, scores, stop_epoch",
    [
        # best 0.8 at epoch 1, then three checks without improvement
        (dict(patience=3), [1.0, 0.8, 0.9, 0.85, 0.81, 0.1, 0.1], 4),
        # 0.97 is within min_delta of 1.0 (no improvement); 0.9 is one and resets the count
        (dict(patience=2, min_delta=0.05), [1.0, 0.97, 0.9, 0.88, 0.87, 0.1], 4),
        (dict(mode="max", patience=5, stopping_threshold=0.9), [0.1, 0.5, 0.95, 0.99, 1.0], 2),
        (dict(patience=5, divergence_threshold=10.0), [1.0, 2.0, 11.0, 0.5], 2),
        (dict(patience=5), [1.0, math.nan, 0.5], 1),
    ],
)
def test_stops_at_the_expected_epoch(kwargs, scores, stop_epoch):
    stopper = fj.EarlyStopping("val/score", **kwargs)
    trainer = _fit(stopper, scores)
    assert stopper.stopped_epoch == stop_epoch
    assert trainer.current_epoch == stop_epoch + 1  # the stopping epoch still finishes
    assert trainer.global_step == 2 * (stop_epoch + 1)
    assert stopper.stopping_reason


def test_runs_to_the_end_while_improving():
    """stopped_epoch stays 0 when training did not stop (Lightning's
    callbacks/test_early_stopping.py::test_early_stopping_no_val_step reads `stopped_epoch > 0`)."""
    stopper = fj.EarlyStopping("val/score", patience=1)
    trainer = _fit(stopper, [5.0, 4.0, 3.0], max_epochs=3)
    assert stopper.stopped_epoch == 0 and trainer.current_epoch == 3
    assert stopper.best_score == pytest.approx(3.0)


def test_a_key_never_logged_is_an_error_listing_the_logged_keys():
    with pytest.raises(RuntimeError, match=r"val/scroe.*'train/loss_epoch'.*'val/score'"):
        _fit(fj.EarlyStopping("val/scroe"), [1.0])


def test_train_keys_are_checked_at_epoch_end_and_counters_survive_a_state_dict():
    stopper = fj.EarlyStopping("train/loss_epoch", mode="max", patience=2)  # loss falls: never better
    trainer = _fit(stopper, [1.0] * 10)
    assert stopper.check_on_train_epoch_end and stopper.stopped_epoch == 2 and trainer.current_epoch == 3

    restored = fj.EarlyStopping("train/loss_epoch", mode="max", patience=2)
    restored.load_state_dict(stopper.state_dict())
    assert (restored.wait_count, restored.best_score, restored.stopped_epoch) == (2, stopper.best_score, 2)


def test_bad_arguments_name_the_argument():
    with pytest.raises(ValueError, match=r"mode=.*'mean'"):
        fj.EarlyStopping("val/loss", mode="mean")
    with pytest.raises(ValueError, match=r"patience=.*-1"):
        fj.EarlyStopping("val/loss", patience=-1)
