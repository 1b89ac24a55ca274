"""Time-based `val_check_interval` ("DD:HH:MM:SS", timedelta, dict), as Lightning 2.6: validation
after the first train step ending that long after the last validation (or the start of training),
none at epoch ends."""

from __future__ import annotations

import datetime
import time

import numpy as np
import pytest
from helpers import Regressor, persistent_compile_cache, quiet_trainer

import fitjax as fj

# Lightning 2.6 (/work/lvenv, torch CPU): 32 rows, batch 4 (8 batches an epoch), max_epochs=2, a
# LightningModule whose `on_train_batch_end` sleeps 2.4 s after batches 2 and 5, and
# val_check_interval "00:00:00:02", timedelta(seconds=2) or {"seconds": 2} (the same for all three;
# with 1.2 s sleeps and a 1 s interval too):
# the (epoch, batch_idx) of the train batch each validation followed.
LIGHTNING_VALIDATIONS = [(0, 2), (0, 5), (1, 2), (1, 5)]
INTERVAL = 2.0


class Clock(fj.Callback):
    """Sleeps 2.4 s after batches 2 and 5; records when each batch's hooks ended and each validation."""

    def __init__(self):
        self.start, self.ends, self.validations = None, [], []

    def on_train_start(self, trainer, module):
        self.start = time.monotonic()

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.last = (trainer.current_epoch, batch_idx)
        if batch_idx in (2, 5):
            time.sleep(2.4)
        self.ends.append((self.last, time.monotonic()))

    def on_validation_end(self, trainer, module):
        if not trainer.sanity_checking:
            self.validations.append((self.last, time.monotonic()))

    def by_rule(self):
        """The batches Lightning's rule picks from the times this run had."""
        picked, last = [], self.start
        done = dict(self.validations)
        for where, end in self.ends:
            if end - last >= INTERVAL:
                picked.append(where)
                last = done.get(where, end)
        return picked


def test_validates_where_lightning_does(tmp_path):
    # under dp: the clock is the loop's, the same for every strategy (one run: it sleeps ~10 s)
    strategy = "dp"
    # 8 batches an epoch as Lightning's run (batches of 8 here: 8 devices share each)
    data = fj.DataLoader({"x": np.arange(64, dtype=np.float32)[:, None], "y": np.zeros((64, 1), np.float32)},
                         batch_size=8)
    with persistent_compile_cache(tmp_path):  # a first fit compiles; the timed one reads the cache
        quiet_trainer(max_steps=1, strategy=strategy).fit(Regressor(batchnorm=False), data, data)
        clock = Clock()
        trainer = quiet_trainer(max_epochs=2, strategy=strategy, val_check_interval={"seconds": 2}, callbacks=[clock])
        trainer.fit(Regressor(batchnorm=False), data, data)
    seen = [where for where, _ in clock.validations]
    assert seen == clock.by_rule()
    # unless the first two steps (compiling) took longer than the interval: Lightning's batches
    first_gap = clock.ends[1][1] - clock.start
    if first_gap < INTERVAL:
        assert seen == LIGHTNING_VALIDATIONS
    assert trainer.num_training_batches == 8 and (0, 7) not in seen  # none at an epoch's end


@pytest.mark.parametrize("value", ["00:00:00:01", datetime.timedelta(seconds=1), {"seconds": 1}])
def test_the_three_forms(value):
    assert fj.Trainer(val_check_interval=value).val_check_interval == datetime.timedelta(seconds=1)


def test_bad_durations_are_named():
    with pytest.raises(ValueError, match=r"val_check_interval=.*'1:2' is not a valid duration.*DD:HH:MM:SS"):
        fj.Trainer(val_check_interval="1:2")
    with pytest.raises(ValueError, match=r"val_check_interval=.*must be a positive duration"):
        fj.Trainer(val_check_interval=datetime.timedelta(0))
    with pytest.raises(ValueError, match=r"timedelta's arguments"):
        fj.Trainer(val_check_interval={"hour": 1})


def test_the_clock_restarts_after_the_validation_hooks():
    """The time the validation hooks take does not count towards the next interval: Lightning sets
    its clock at the end of its evaluation loop's run, after `on_validation_end`.

    Lightning 2.6 (/work/lvenv), 64 rows in batches of 4 (16 a epoch), max_epochs=2,
    val_check_interval={"seconds": 1}, a callback sleeping 0.1 s in `on_train_batch_end` and 1.2 s
    in `on_validation_end`: validations after (epoch, batch) (0, 9), (1, 3), (1, 13): ten batches
    apart. Were the 1.2 s counted, every batch after the first validation would validate."""

    class Slow(fj.Callback):
        def __init__(self):
            self.validations = []

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            self.last = trainer.current_epoch * 16 + batch_idx
            time.sleep(0.1)

        def on_validation_end(self, trainer, module):
            if not trainer.sanity_checking:
                self.validations.append(self.last)
                time.sleep(1.2)

    data = fj.DataLoader({"x": np.zeros((64, 1), np.float32), "y": np.zeros((64, 1), np.float32)}, batch_size=4)
    slow = Slow()
    quiet_trainer(max_epochs=2, strategy="single", num_sanity_val_steps=0, val_check_interval={"seconds": 1},
                  callbacks=[slow]).fit(Regressor(batchnorm=False), data, data)
    gaps = np.diff(slow.validations)
    assert len(slow.validations) >= 2 and gaps.min() >= 5, slow.validations  # Lightning's: 10 apart
