"""The loop's stop handling: the stop request callbacks write (`trainer.should_stop`), how every
process agrees on it, what a stop obeyed between two batches does (`pause_epoch`) and what one
at an epoch's end says when `min_epochs`/`min_steps` hold it back.

Whether a request is obeyed now is the schedule's question (`_schedule.can_stop_early`,
`agreed_stop`); a signal's stop (SIGTERM, the requeue signal, a deferred Ctrl-C) is agreed by
`fitjax.strategies.StopAgreement` and acted on by `_preemption`. These functions take the
request and the values they need, never the Trainer (it is only handed on to the callbacks).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Sequence

from fitjax.loop import _schedule as schedule
from fitjax.loop.config import LoopConfig
from fitjax.loop.progress import Progress, ProgressView

__all__ = ["StopRequest", "agree", "agree_at_epoch_end", "pause_epoch"]

log = logging.getLogger("fitjax")


@dataclasses.dataclass(eq=False)
class StopRequest:
    """What asked the fit to stop: one object for the Trainer's life, shared by the Trainer
    (`should_stop` reads and writes `requested`) and the batch loop (an attribute read per step,
    no call).

    Attributes:
        requested: `trainer.should_stop` (a callback's request, or the agreed one).
        sigterm: whether the last fit's agreed signal stop was SIGTERM's (None: no agreed
            signal stop; `trainer.received_sigterm`).
        signal: the reason of the agreed signal stop the batch loop ended on ("SIGTERM", ...).
    """

    requested: bool = False
    sigterm: bool | None = None
    signal: str | None = None

    def start_fit(self) -> None:
        """A new fit: no signal stop yet (`requested` is cleared by the fit when training starts)."""
        self.sigterm = self.signal = None

    def signalled(self, reason: str) -> None:
        """The processes agreed to stop for `reason` after this step (the same on every process:
        the save that follows is collective)."""
        self.sigterm, self.signal = reason == "SIGTERM", reason


def agree(request: StopRequest, *, synced: bool) -> bool:
    """`requested` as every process sees it (`schedule.agreed_stop`), written back: compared at
    sync points only with several processes, so False between them (the request waits)."""
    agreed = schedule.agreed_stop(request.requested, synced=synced)
    if agreed is None:
        return False
    request.requested = agreed
    return agreed


def agree_at_epoch_end(request: StopRequest, config: LoopConfig, progress: ProgressView) -> None:
    """The epoch's end is a sync point: the request agreed, and Lightning's line when
    `min_epochs`/`min_steps` keep the run going."""
    agree(request, synced=True)
    if request.requested and not schedule.can_stop_early(config, progress):
        log.info(
            "Trainer was signaled to stop but the required min_epochs=%r or min_steps=%r has not "
            "been met. Training will continue...", config.min_epochs, config.min_steps)


def pause_epoch(progress: Progress, checkpoint_callbacks: Sequence[Any], trainer: Any, module: Any, *,
                is_global_zero: bool) -> None:
    """A stop request obeyed between two batches (max_time, a callback's `should_stop`): the
    epoch is not over, so its validation and end work (epoch means, `on_train_epoch_end`) are
    left to the fit that resumes it and reaches its real end, as an uninterrupted run does them
    once there (Lightning ends the epoch at the stop and its resume skips the rest). The
    checkpoint callbacks save the point a resume continues from (`trainer` is handed to them)."""
    if is_global_zero:
        of = "" if progress.batches_in_epoch is None else f" of {progress.batches_in_epoch}"
        log.info(f"Stopped after batch {progress.batches_done}{of} of epoch {progress.epoch} (global step "
                 f"{progress.global_step}); a fit resumed from its checkpoint finishes that epoch.")
    for callback in checkpoint_callbacks:
        callback.save_at_stop(trainer, module)
