"""A stop between two batches and its resume make the uninterrupted run: the same weights bitwise,
the same logged rows, and the stopped epoch's validation and `on_train_epoch_end` once, at its
real end (issue 33, item 4; Lightning ends the epoch at the stop and its resume skips the rest)."""

from __future__ import annotations

import csv
import os
import signal
import time

import pytest
from helpers import LossHistory, Regressor, assert_trees_close, quiet_trainer, regression_data

import fitjax as fj

DATA = regression_data(n=64)  # 8 batches of 8 an epoch
VAL = regression_data(n=16, seed=1)
STOP_AT = 10  # after batch 1 of epoch 1's 8
MAX_TIME = 4  # seconds: far more than the steps before STOP_AT take (their program is cached)


pytestmark = pytest.mark.usefixtures("compile_cache")  # tests/conftest.py


class Hooks(fj.Callback):
    """Where validation and the epoch's end ran: (hook, epoch, global step)."""

    def __init__(self, seen):
        self.seen = seen

    def on_validation_end(self, trainer, module):
        if not trainer.sanity_checking:
            self.seen.append(("val", trainer.current_epoch, trainer.global_step))

    def on_train_epoch_end(self, trainer, module):
        self.seen.append(("epoch_end", trainer.current_epoch, trainer.global_step))


class StopAt(fj.Callback):
    def __init__(self, how):
        self.how = how

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step == STOP_AT:
            if self.how == "max_time":  # the Trainer's max_time (MAX_TIME s) runs out at this step
                time.sleep(MAX_TIME + 0.5)
            elif self.how == "sigterm":
                os.kill(os.getpid(), signal.SIGTERM)  # a real signal, handled by fit
            else:
                trainer.should_stop = True  # what max_time's Timer and EarlyStopping do


def _fit(root, seen, *extra, ckpt_path=None, **limits):
    """A fit of 2 epochs (fewer with `limits`: max_time, max_steps) with `extra` callbacks."""
    history = LossHistory()
    trainer = quiet_trainer(max_epochs=2, strategy="single", log_every_n_steps=3, num_sanity_val_steps=0,
                            enable_checkpointing=True, logger=fj.loggers.CSVLogger(root), default_root_dir=root,
                            callbacks=[history, Hooks(seen), *extra], **limits)
    module = Regressor(batchnorm=False)
    trainer.fit(module, fj.DataLoader(DATA, batch_size=8, shuffle=True, seed=3),
                fj.DataLoader(VAL, batch_size=8), ckpt_path=ckpt_path)
    return trainer, module, history.losses


def _rows(root):
    with open(root / "fitjax_logs" / "version_0" / "metrics.csv") as f:
        rows = [{k: v for k, v in row.items() if v and not k.startswith("compile/")} for row in csv.DictReader(f)]
    return [row for row in rows if set(row) != {"step"}]  # compile times: measured, not computed


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    root, seen = tmp_path_factory.mktemp("full"), []
    _, module, losses = _fit(root, seen)
    return module, losses, seen, _rows(root)


@pytest.mark.parametrize("how", ["should_stop", "sigterm", "max_time"])
def test_a_stop_between_two_batches_resumes_into_the_uninterrupted_run(tmp_path, uninterrupted, how):
    full_module, full_losses, full_seen, full_rows = uninterrupted
    assert full_seen == [("val", 0, 8), ("epoch_end", 0, 8), ("val", 1, 16), ("epoch_end", 1, 16)]
    seen = []
    limits = {"max_time": {"seconds": MAX_TIME}} if how == "max_time" else {}
    stopped, _, first = _fit(tmp_path, seen, StopAt(how), **limits)
    assert stopped.global_step == STOP_AT and stopped.current_epoch == 1  # epoch 1 is not over
    assert seen == full_seen[:2]  # no validation or epoch end at the stop
    saved = sorted(p.name for p in (tmp_path / "fitjax_logs" / "version_0" / "checkpoints").iterdir())
    assert saved == ["epoch=1-step=10"]  # the stop's save replaced epoch 0's (save_top_k=1)

    resumed, module, second = _fit(tmp_path, seen, ckpt_path="last")
    assert len(second) == 16 - STOP_AT  # epoch 1 from batch 2: none replayed, none skipped
    assert first + second == full_losses
    assert_trees_close(module.variables, full_module.variables, rtol=0, atol=0)
    assert seen == full_seen  # epoch 1's validation and end once, at step 16
    assert _rows(tmp_path) == full_rows  # the same rows, steps and values as the uninterrupted run
    assert resumed.global_step == 16 and resumed.current_epoch == 2


def test_max_steps_raised_on_resume_trains_the_rest_of_the_epoch_into_the_uninterrupted_run(tmp_path, uninterrupted):
    """`max_steps` reached inside an epoch is the run's configured end: it ends the epoch there
    (no validation: Lightning validates there only for a stop request), as Lightning does
    (docs/porting.md). Resumed with a larger `max_steps`, the fit
    trains the epoch's remaining batches, none skipped or replayed, into the uninterrupted run's
    weights, and ends the epoch again at its real end."""
    full_module, full_losses, full_seen, _ = uninterrupted
    seen = []
    first, _, losses = _fit(tmp_path, seen, max_steps=STOP_AT)
    assert first.global_step == STOP_AT
    assert seen == [*full_seen[:2], ("epoch_end", 1, STOP_AT)]  # the configured end

    _, module, rest = _fit(tmp_path, seen, ckpt_path="last", max_steps=16)
    assert len(rest) == 16 - STOP_AT  # epoch 1 from batch 2: none replayed, none skipped
    assert losses + rest == full_losses
    assert_trees_close(module.variables, full_module.variables, rtol=0, atol=0)
    assert seen[3:] == [("val", 1, 16), ("epoch_end", 1, 16)]  # again at the epoch's real end
