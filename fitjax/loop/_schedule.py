"""When things happen in the fit loop: whether training is done or skipped, whether a stop
request is obeyed now, whether validation is due after a call of the train step.

`Schedule` is a part of `Trainer`: its questions read the trainer's limits and the loop's one
`Progress`; it lives here so that `trainer.py` reads as the fit loop's outline. The loop owns
scheduling: these are asked by the loop only (callbacks ask `trainer.progress.crossed(n)`).
"""

from __future__ import annotations

import datetime
import time

import jax

__all__ = ["Schedule"]


class Schedule:
    """The scheduling part of `Trainer` (Lightning's `FitLoop.done`, `skip`, `_should_check_val_fx`)."""

    def _skip_training(self) -> bool:
        """Lightning's `FitLoop.skip`: nothing to train (max_steps=0, max_epochs=0 or
        limit_train_batches=0); fit still builds, sanity-checks and calls on_fit_start/end."""
        return self.num_training_batches == 0 or self.limits["train"] == 0 or self._done_training()

    def _max_steps_reached(self) -> bool:
        return self.max_steps is not None and self.global_step >= self.max_steps

    def _can_stop_early(self) -> bool:
        """A stop request is obeyed once min_epochs and min_steps are met (Lightning)."""
        return ((not self.min_epochs or self.current_epoch >= self.min_epochs)
                and (not self.min_steps or self.global_step >= self.min_steps))

    def _done_training(self) -> bool:
        return (
            self._max_steps_reached()
            or (self.max_epochs is not None and self.current_epoch >= self.max_epochs)
            or (self.should_stop and self._can_stop_early())
        )

    def _validation_enabled(self, val_loaders) -> bool:
        return bool(val_loaders) and self.limits["val"] != 0

    def _val_epoch_due(self, val_loaders) -> bool:
        n = self.check_val_every_n_epoch
        return self._validation_enabled(val_loaders) and (n is None or (self.current_epoch + 1) % n == 0)

    def _val_due(self, val_loaders, *, stop: bool, synced: bool = True) -> bool:
        """Lightning's `_should_check_val_fx`, after each call of the train step: every
        `val_check_interval` batches (counted in the epoch, or over the run when
        check_val_every_n_epoch is None; a float: that fraction of the epoch's batches, rounded
        down, so an epoch may end without one), and at a stop request that will be obeyed."""
        if not self._val_epoch_due(val_loaders):
            return False
        if stop and self._can_stop_early():
            return True
        if isinstance(self.val_check_interval, datetime.timedelta):
            return self._val_time_due(synced)
        across = self.check_val_every_n_epoch is None
        val_every = self._run.val_every
        return val_every is not None and self.progress.crossed_batches(val_every, across_epochs=across)

    def _val_time_due(self, synced: bool) -> bool:
        """Lightning 2.6's time-based `val_check_interval`: validate after the first call of the
        train step that ends `val_check_interval` or more after the last validation ended (or
        training started). A host clock read per call, no device sync; with several processes
        their clocks are agreed on at the sync points (log steps) only."""
        due = time.monotonic() - self._run.last_val_time >= self.val_check_interval.total_seconds()
        if jax.process_count() == 1:
            return due
        return synced and self.agree(due)

    def _time_based_validation(self) -> bool:
        return isinstance(self.val_check_interval, datetime.timedelta)

    def _agree_on_preemption(self) -> str | None:
        """Why every process stops now (SIGTERM, the requeue signal), or None: a signal reaches
        each process at its own step, so the processes agree on the step after the last one any
        of them had passed when the first signal came (`fitjax.strategies._stop_agreement`);
        with one process, the step during which it came."""
        return self._run.stopping.reached(self.global_step)

    def _agree_on_stop(self, *, synced: bool) -> bool:
        """`should_stop` as every process sees it; with several processes it is compared at sync
        points only (log steps, validations), so a stop takes effect there or at the epoch end."""
        if jax.process_count() == 1:
            return self.should_stop
        if synced:
            self.should_stop = self.agree(self.should_stop)
            return self.should_stop
        return False
