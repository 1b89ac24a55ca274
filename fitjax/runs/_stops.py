"""`RunStops`: where each run of a fit stopped early (`Trainer.stop_run`, as `EarlyStopping` asks).

A stopped run's parameters stay as they are while the others train on, but the step still
computes its values every step (the runs are one program). Its logs end at its stop: the
loggers' run folders and the results table read here which rows are a run's last, so its
curve ends where it stopped instead of running on flat.
"""

from __future__ import annotations

from typing import Sequence

__all__ = ["RunStops"]


class RunStops:
    """Each run's stop: the logger step of its last row and the epoch it stopped in.

    Args:
        size: how many runs.
    """

    def __init__(self, size: int):
        self.last_row: list[int | None] = [None] * size  # None: still training
        self.epoch: list[int | None] = [None] * size  # the epoch it stopped in (None: unknown or training)

    def stop(self, run: int, *, last_row: int, epoch: int | None) -> None:
        """Run `run` stopped: rows after `last_row` (a logger step) are not its own."""
        if self.last_row[run] is None:
            self.last_row[run], self.epoch[run] = last_row, epoch

    def begin_fit(self, active: Sequence[bool], *, last_row: int) -> None:
        """A fit starts with `active` runs: a fresh state trains every run; a resumed one keeps
        those stopped before its checkpoint stopped (their rows end at `last_row`, where it resumes)."""
        for run, training in enumerate(active):
            if training:
                self.last_row[run] = self.epoch[run] = None
            elif self.last_row[run] is None:
                self.last_row[run] = last_row

    def logs(self, run: int, step: int) -> bool:
        """Whether a row at logger step `step` is still run `run`'s (at or before its stop)."""
        last = self.last_row[run]
        return last is None or step <= last

    @property
    def stopped(self) -> bool:
        """Whether any run stopped."""
        return any(last is not None for last in self.last_row)
