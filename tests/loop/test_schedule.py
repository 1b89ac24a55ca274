"""The schedule alone: functions of a `LoopConfig` and a `Progress` view, with Lightning's rules
(`FitLoop.done`/`skip`, `_should_check_val_fx`, `FitLoop.setup_data`); each returns its answer
and changes neither argument."""

import time

import pytest

from fitjax.loop import _schedule as schedule
from fitjax.loop.config import LoopConfig
from fitjax.loop.progress import Progress, ProgressView


def _at(epoch=0, step=0, batches_in_epoch=8, before=None, done=None, total_before=None, total=None):
    """A progress view after a call of the train step that ran batches `before`..`done`."""
    p = Progress()
    p.epoch, p.global_step, p.batches_in_epoch = epoch, step, batches_in_epoch
    p.batches_before, p.batches_done = (before or 0), (done or 0)
    p.total_before, p.total_batches = (total_before if total_before is not None else p.batches_before,
                                       total if total is not None else p.batches_done)
    return ProgressView(p)


def test_training_ends_at_max_steps_max_epochs_or_an_obeyed_stop():
    config = LoopConfig.create(max_epochs=3, max_steps=10, min_epochs=2, min_steps=5)
    assert not schedule.done_training(config, _at(epoch=2, step=9), should_stop=False)
    assert schedule.done_training(config, _at(epoch=2, step=10), should_stop=False)  # max_steps
    assert schedule.done_training(config, _at(epoch=3, step=4), should_stop=False)  # max_epochs
    # a stop request waits for min_epochs and min_steps (Lightning: "Training will continue...")
    assert not schedule.done_training(config, _at(epoch=1, step=8), should_stop=True)
    assert not schedule.done_training(config, _at(epoch=2, step=4), should_stop=True)
    assert schedule.done_training(config, _at(epoch=2, step=5), should_stop=True)
    unlimited = LoopConfig.create(max_epochs=-1)
    assert not schedule.done_training(unlimited, _at(epoch=10**6, step=10**9), should_stop=False)


@pytest.mark.parametrize("arguments, batches, skipped", [
    (dict(max_steps=0), 8, True), (dict(max_epochs=0), 8, True), (dict(limit_train_batches=0), 8, True),
    (dict(limit_train_batches=0.0), 8, True), (dict(), 0, True), (dict(), 8, False), (dict(), None, False)])
def test_fit_skips_training_as_lightning(arguments, batches, skipped):
    assert schedule.skip_training(LoopConfig.create(**arguments), _at(batches_in_epoch=batches),
                                  should_stop=False) is skipped


# Lightning's FitLoop.setup_data: an int counts batches, a float a fraction of the epoch's
# (rounded down, at least 1), None once an epoch; a duration is the clock's
@pytest.mark.parametrize("interval, every_n_epoch, batches, expected", [
    (None, 1, 10, 10), (0.25, 1, 10, 2), (0.05, 1, 10, 1), (1.0, 1, None, None), (None, 1, None, None),
    (3, 1, 10, 3), (25, None, 10, 25), ({"seconds": 5}, 1, 10, None)])
def test_the_validation_interval_in_batches(interval, every_n_epoch, batches, expected):
    config = LoopConfig.create(val_check_interval=interval, check_val_every_n_epoch=every_n_epoch)
    assert schedule.val_check_batches(config, batches, ["val"]) == expected


def test_interval_errors_are_lightnings():
    with pytest.raises(ValueError, match=r"val_check_interval=25\) must be at most the number of train batches "
                                         r"per epoch \(10\).*check_val_every_n_epoch=None"):
        schedule.val_check_batches(LoopConfig.create(val_check_interval=25), 10, ["val"])
    # without validation data the interval asks nothing
    assert schedule.val_check_batches(LoopConfig.create(val_check_interval=25), 10, []) == 25
    with pytest.raises(ValueError, match=r"val_check_interval=0.5\): a fraction of an epoch needs train data "
                                         r"with a known length"):
        schedule.val_check_batches(LoopConfig.create(val_check_interval=0.5), None, ["val"])


def test_validation_is_due_every_interval_in_the_epochs_that_validate():
    config = LoopConfig.create(check_val_every_n_epoch=2)
    due = dict(stop=False, synced=True, val_every=4, last_val_time=0.0)
    assert not schedule.val_due(config, _at(epoch=0, before=3, done=4), ["val"], **due)  # epoch 1 of 2
    assert schedule.val_due(config, _at(epoch=1, before=3, done=4), ["val"], **due)
    assert not schedule.val_due(config, _at(epoch=1, before=4, done=5), ["val"], **due)
    assert schedule.val_due(config, _at(epoch=1, before=2, done=6), ["val"], **due)  # several batches a call
    assert not schedule.val_due(config, _at(epoch=1, before=3, done=4), [], **due)  # no validation data
    # a stop that will be obeyed validates now (Lightning's `_should_check_val_fx`)
    assert schedule.val_due(config, _at(epoch=1, before=4, done=5), ["val"], **{**due, "stop": True})
    # check_val_every_n_epoch=None: the interval counts batches over the whole run
    across = LoopConfig.create(check_val_every_n_epoch=None, val_check_interval=5)
    run = dict(stop=False, synced=True, val_every=5, last_val_time=0.0)
    assert schedule.val_due(across, _at(epoch=1, before=1, done=2, total_before=9, total=10), ["val"], **run)
    assert not schedule.val_due(across, _at(epoch=1, before=4, done=5, total_before=12, total=13), ["val"], **run)


def test_a_duration_validates_by_the_clock_and_not_at_epoch_ends():
    config = LoopConfig.create(val_check_interval={"seconds": 30})
    due = dict(stop=False, synced=False, val_every=None)
    now = time.monotonic()
    assert schedule.time_based(config) and not schedule.time_based(LoopConfig())
    assert not schedule.val_due(config, _at(before=0, done=1), ["val"], **due, last_val_time=now)
    assert schedule.val_due(config, _at(before=0, done=1), ["val"], **due, last_val_time=now - 31)


def test_one_process_agrees_with_itself_and_nothing_is_written():
    config, progress = LoopConfig.create(max_steps=4), _at(step=4)
    before = progress.state_dict()
    assert schedule.agreed_stop(True, synced=False) is True and schedule.agreed_stop(False, synced=True) is False
    assert schedule.max_steps_reached(config, progress) and schedule.can_stop_early(config, progress)
    assert progress.state_dict() == before and config == LoopConfig.create(max_steps=4)
