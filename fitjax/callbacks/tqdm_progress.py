"""`TQDMProgressBar`: Lightning's default progress bar, by name and arguments."""

from __future__ import annotations

from fitjax.callbacks.progress import RichProgressBar

__all__ = ["TQDMProgressBar"]


class TQDMProgressBar(RichProgressBar):
    """Lightning's `TQDMProgressBar(refresh_rate, process_position, leave)`, drawn by fitjax's
    Rich bar: a Lightning config or script that names it runs unchanged and shows the same
    counters, losses and per-epoch lines as `RichProgressBar` (fitjax does not depend on tqdm).

    Args:
        refresh_rate: redraw every this many batches (Lightning's meaning), >= 1; Lightning's
            `refresh_rate=0` (no bar) is `Trainer(enable_progress_bar=False)` here.
        process_position: Lightning's line offset for several bars at once; only process 0 draws
            a bar under fitjax, so it is accepted and has nothing to move.
        leave: accepted; each finished epoch always leaves its summary line.

    Example:
        >>> import fitjax as fj
        >>> trainer = fj.Trainer(callbacks=[fj.TQDMProgressBar(refresh_rate=10)], logger=False)
        >>> [type(cb).__name__ for cb in trainer.callbacks if isinstance(cb, fj.RichProgressBar)]
        ['TQDMProgressBar']
    """

    def __init__(self, refresh_rate: int = 1, process_position: int = 0, leave: bool = False):
        if refresh_rate == 0 and not isinstance(refresh_rate, bool):
            raise ValueError("TQDMProgressBar(refresh_rate=0) hides the bar in Lightning; here pass "
                             "`Trainer(enable_progress_bar=False)` instead.")
        if not isinstance(process_position, int) or isinstance(process_position, bool) or process_position < 0:
            raise ValueError(f"TQDMProgressBar(process_position=...) must be an int >= 0, got {process_position!r}")
        if not isinstance(leave, bool):
            raise ValueError(f"TQDMProgressBar(leave=...) must be True or False, got {leave!r}")
        super().__init__(refresh_rate=refresh_rate)
        self.process_position, self.leave = process_position, leave
