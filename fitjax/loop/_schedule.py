"""When things happen in the fit loop: whether training is done or skipped, whether a stop
request is obeyed now, whether validation is due after a call of the train step.

Plain functions of the loop's configuration (`LoopConfig`), its position (`trainer.progress`, a
read-only view) and the few values of the running fit they need (the validation interval in
batches, when the last validation ended, the stop request); each returns its answer and writes
nothing: the loop assigns what it decides (`should_stop`, through `_stop`). The loop owns
scheduling: these are asked by the loop only (callbacks ask `trainer.progress.crossed(n)`).
Lightning's names for the same questions: `FitLoop.done`, `FitLoop.skip`,
`_should_check_val_fx`, `FitLoop.setup_data`.
"""

from __future__ import annotations

import datetime
import math
import time
from typing import Sequence

import jax

from fitjax.loop.config import LoopConfig
from fitjax.loop.progress import ProgressView
from fitjax.strategies import agree

__all__ = ["agreed_stop", "can_stop_early", "done_training", "epoch_exhausted", "max_steps_reached", "reload_due",
           "skip_training", "stepping_batches", "time_based", "val_check_batches", "val_due", "val_epoch_due",
           "validation_enabled"]


def max_steps_reached(config: LoopConfig, progress: ProgressView) -> bool:
    return config.max_steps is not None and progress.global_step >= config.max_steps


def epoch_exhausted(progress: ProgressView) -> bool:
    """Whether the epoch's batches are all stepped (False for data without a length: only the
    loader running out tells, and the loop sees that as the end of its batches)."""
    total = progress.batches_in_epoch
    return total is not None and progress.batches_done >= total


def can_stop_early(config: LoopConfig, progress: ProgressView) -> bool:
    """A stop request is obeyed once min_epochs and min_steps are met (Lightning)."""
    return ((not config.min_epochs or progress.epoch >= config.min_epochs)
            and (not config.min_steps or progress.global_step >= config.min_steps))


def done_training(config: LoopConfig, progress: ProgressView, *, should_stop: bool) -> bool:
    """Lightning's `FitLoop.done`: max_steps or max_epochs reached, or a stop request obeyed."""
    return (
        max_steps_reached(config, progress)
        or (config.max_epochs is not None and progress.epoch >= config.max_epochs)
        or (should_stop and can_stop_early(config, progress))
    )


def skip_training(config: LoopConfig, progress: ProgressView, *, should_stop: bool) -> bool:
    """Lightning's `FitLoop.skip`: nothing to train (max_steps=0, max_epochs=0 or
    limit_train_batches=0); fit still builds, sanity-checks and calls on_fit_start/end."""
    return (progress.batches_in_epoch == 0 or config.limits["train"] == 0
            or done_training(config, progress, should_stop=should_stop))


def reload_due(config: LoopConfig, progress: ProgressView, loaded_at: int) -> bool:
    """Whether fit asks the loader hooks again at this epoch's start (`reload_dataloaders_every_n_epochs`
    epochs after epoch `loaded_at`, when they were last asked)."""
    n = config.reload_dataloaders_every_n_epochs
    return bool(n) and progress.epoch - loaded_at >= n


def validation_enabled(config: LoopConfig, val_loaders: Sequence) -> bool:
    return bool(val_loaders) and config.limits["val"] != 0


def val_epoch_due(config: LoopConfig, progress: ProgressView, val_loaders: Sequence) -> bool:
    """Whether the current epoch validates at all (`check_val_every_n_epoch`)."""
    n = config.check_val_every_n_epoch
    return validation_enabled(config, val_loaders) and (n is None or (progress.epoch + 1) % n == 0)


def time_based(config: LoopConfig) -> bool:
    """Whether `val_check_interval` is a duration (Lightning 2.6): no validation at epoch ends."""
    return isinstance(config.val_check_interval, datetime.timedelta)


def val_due(config: LoopConfig, progress: ProgressView, val_loaders: Sequence, *, stop: bool, synced: bool,
            val_every: int | None, last_val_time: float) -> bool:
    """Lightning's `_should_check_val_fx`, after each call of the train step: every
    `val_check_interval` batches (`val_every`, from `val_check_batches`: counted in the epoch, or
    over the run when check_val_every_n_epoch is None; a float: that fraction of the epoch's
    batches, rounded down, so an epoch may end without one), and at a stop request (`stop`, as
    agreed) that will be obeyed at the epoch's last batch (a stop between two batches leaves the
    epoch's validation to its end, in the fit that resumes it). With a duration: after the first call that ends that long after
    `last_val_time` (time.monotonic of the last validation's end, or of training's start); a
    host clock read per call, no device sync; with several processes their clocks are agreed on
    at the sync points (`synced`: log steps) only."""
    if not val_epoch_due(config, progress, val_loaders):
        return False
    if stop and can_stop_early(config, progress):
        return True
    if time_based(config):
        due = time.monotonic() - last_val_time >= config.val_check_interval.total_seconds()
        if jax.process_count() == 1:
            return due
        return synced and agree(due)
    across = config.check_val_every_n_epoch is None
    return val_every is not None and progress.crossed_batches(val_every, across_epochs=across)


def agreed_stop(should_stop: bool, *, synced: bool) -> bool | None:
    """The stop request as every process sees it, for the loop to assign to `should_stop`; None
    when the processes cannot compare it now. With several processes it is compared at sync
    points only (`synced`: log steps, validations, epoch ends), so a stop takes effect there or
    at the epoch end; with one process the request is the agreement."""
    if jax.process_count() == 1:
        return bool(should_stop)
    return agree(should_stop) if synced else None


def val_check_batches(config: LoopConfig, num_batches: int | None, val_loaders: Sequence) -> int | None:
    """Validate every this many train batches (of `num_batches` an epoch); None: at the end of
    each epoch (data without a length, default interval) or by the clock (a duration). Lightning's
    `FitLoop.setup_data` rules and errors (an int interval longer than an epoch is an error only
    when `val_loaders` are validated)."""
    validating = validation_enabled(config, val_loaders)
    interval, per_epoch = config.val_check_interval, config.check_val_every_n_epoch is not None
    if isinstance(interval, datetime.timedelta):  # time-based: the loop's clock decides (`val_due`)
        return None
    if isinstance(interval, int):
        if validating and per_epoch and num_batches is not None and interval > num_batches:
            raise ValueError(
                f"Trainer(val_check_interval={interval}) must be at most the number of train batches "
                f"per epoch ({num_batches}). To validate across epochs every {interval} batches set "
                "check_val_every_n_epoch=None; to disable validation set limit_val_batches=0."
            )
        return interval
    if num_batches is None:
        if interval not in (None, 1.0):
            raise ValueError(
                f"Trainer(val_check_interval={interval!r}): a fraction of an epoch needs train data "
                "with a known length (len()); pass an int number of batches instead."
            )
        return None
    return max(1, int(num_batches * (1.0 if interval is None else interval)))


def stepping_batches(config: LoopConfig, num_batches: int | None, accumulate: int, *, size_known: bool) -> int | float:
    """Lightning's `estimated_stepping_batches`: the optimizer steps a fit takes at most, from the
    train batches per epoch (`num_batches`: None when the data has no length, or, unless
    `size_known`, when fit has not measured it yet: an error saying when it is known)."""
    limited_steps = math.inf if config.max_steps is None else config.max_steps
    if config.max_epochs is None:
        return limited_steps
    if num_batches is None:
        if size_known:  # data without a length: only max_steps bounds an epoch
            return limited_steps
        raise RuntimeError(
            "trainer.estimated_stepping_batches is known once Trainer.fit has its train data: "
            "read it from on_fit_start, configure_optimizer or later."
        )
    return min(math.ceil(num_batches / accumulate) * config.max_epochs, limited_steps)
