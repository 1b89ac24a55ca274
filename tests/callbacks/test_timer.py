"""`Timer` and `Trainer(max_time=...)`: Lightning's forms, a clean stop with a checkpoint, resume.

The expected behaviour is Lightning's `lightning/pytorch/callbacks/timer.py` and
`trainer/connectors/callback_connector.py` (`_configure_timer_callback`): the duration forms, the
error on a malformed string, `max_time` adding a step-interval Timer unless one is given, the
check in `on_fit_start` after a resume, and the training time stored in the checkpoint.
"""

from __future__ import annotations

import datetime
import time

import pytest
from helpers import Regressor, persistent_compile_cache, quiet_trainer, regression_data

import fitjax as fj
from fitjax import checkpoint


class Slow(fj.Callback):
    """Each step takes at least `seconds` on the host (a tiny model's step is ~1 ms)."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        time.sleep(self.seconds)


@pytest.mark.parametrize("value, expected", [
    ("00:12:30:05", datetime.timedelta(hours=12, minutes=30, seconds=5)),
    ("  1:00:00:00 ", datetime.timedelta(days=1)),
    ({"minutes": 2, "seconds": 3}, datetime.timedelta(minutes=2, seconds=3)),
    (datetime.timedelta(seconds=7), datetime.timedelta(seconds=7)),
])
def test_durations_in_lightnings_forms(value, expected):
    assert fj.Timer(duration=value).time_remaining() == expected.total_seconds()
    assert fj.Timer().time_remaining() is None and fj.Timer().time_elapsed() == 0.0


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(duration="12:00:00"), ValueError, "Timer(duration=...)='12:00:00' is not a valid duration: expected a string 'DD:HH:MM:SS'"),
    (dict(duration={"hour": 1}), ValueError, "the dict's keys must be datetime.timedelta's arguments"),
    (dict(duration=3600), TypeError, "got int: 3600"),
    (dict(interval="batch"), ValueError, "Timer(interval=...) must be one of ('step', 'epoch'), got 'batch'"),
])
def test_bad_timer_arguments_are_named(kwargs, error, message):
    with pytest.raises(error) as raised:
        fj.Timer(**kwargs)
    assert message in str(raised.value)


def test_trainer_max_time_is_checked_and_named():
    with pytest.raises(ValueError, match=r"Trainer\(max_time=...\)='1:00' is not a valid duration"):
        fj.Trainer(max_time="1:00", logger=False)


def test_max_time_adds_one_step_timer_unless_the_callbacks_have_one():
    trainer = quiet_trainer(max_time={"hours": 1})
    timers = [cb for cb in trainer.callbacks if isinstance(cb, fj.Timer)]
    assert len(timers) == 1 and timers[0]._interval == "step" and timers[0].time_remaining() == 3600
    # Lightning: with max_time and neither max_epochs nor max_steps, epochs are unlimited (not 1000)
    assert trainer.max_epochs is None and quiet_trainer().max_epochs == 1000
    own = fj.Timer(duration="00:00:00:05", interval="epoch")
    trainer = quiet_trainer(max_time={"hours": 1}, callbacks=[own])
    assert [cb for cb in trainer.callbacks if isinstance(cb, fj.Timer)] == [own]


def test_max_time_stops_cleanly_with_a_checkpoint_and_a_resumed_fit_keeps_the_clock(tmp_path):
    data = fj.DataLoader(regression_data(n=64), batch_size=16)  # 4 steps per epoch
    with persistent_compile_cache(tmp_path / "xla"):  # the timed fits load the step, not compile it
        quiet_trainer(max_steps=1, strategy="single").fit(Regressor(), data)
        # max_steps only bounds a broken timer (0.1 s steps: 5 s)
        trainer = quiet_trainer(max_time={"seconds": 1}, max_steps=50, callbacks=[Slow(0.1)],
                                enable_checkpointing=True, default_root_dir=tmp_path, strategy="single")
        trainer.fit(Regressor(), data)
        timer = next(cb for cb in trainer.callbacks if isinstance(cb, fj.Timer))
        steps = trainer.global_step
        # how many steps fit in 1 s depends on the machine's load: the exact rule is checked below
        assert timer.time_elapsed("train") >= 1.0 and 1 <= steps < 50, (timer.time_elapsed(), steps)
        assert timer.end_time("train") is not None and trainer.should_stop and not trainer.received_sigterm
        saved = trainer.checkpoint_callback.last_model_path or trainer.checkpoint_callback.best_model_path
        assert saved.endswith(f"step={steps}") and checkpoint.is_checkpoint(saved)  # the stop's checkpoint
        stored = checkpoint.read_meta(saved)["callbacks"]["Timer"]["time_elapsed"]["train"]
        assert stored >= 1.0

        # the same limit, resumed: its time was spent, so no step is trained (Lightning's on_fit_start check)
        again = quiet_trainer(max_time={"seconds": 1}, strategy="single")
        again.fit(Regressor(), data, ckpt_path=saved)
        assert again.global_step == steps and again.should_stop
        # a larger limit continues the clock from the stored time, and stops after the first step
        # whose check saw the limit passed (`Elapsed` reads the clock just after the timer's check)
        elapsed = Elapsed()
        more = quiet_trainer(callbacks=[Slow(0.1), fj.Timer(duration={"seconds": stored + 0.5}), elapsed],
                             max_steps=steps + 50, strategy="single")
        more.fit(Regressor(), data, ckpt_path=saved)
    assert elapsed.seen[0] > stored and all(t < stored + 0.5 for t in elapsed.seen[:-1])
    assert elapsed.seen[-1] >= stored + 0.5 and more.global_step == steps + len(elapsed.seen) < steps + 50


class Elapsed(fj.Callback):
    """Reads the timer after each step, after the timer's own check (it is the next callback)."""

    def __init__(self):
        self.seen = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        timer = next(cb for cb in trainer.callbacks if isinstance(cb, fj.Timer))
        self.seen.append(timer.time_elapsed("train"))
