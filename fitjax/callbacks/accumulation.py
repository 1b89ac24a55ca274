"""`GradientAccumulationScheduler`: `accumulate_grad_batches` by epoch, as Lightning's callback."""

from __future__ import annotations

from fitjax.callbacks._base import Callback

__all__ = ["GradientAccumulationScheduler"]


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class GradientAccumulationScheduler(Callback):
    """Changes `accumulate_grad_batches` at the epochs given (Lightning's callback).

    `scheduling={0: 4, 2: 1}`: 4 micro-batches per optimizer step in epochs 0 and 1, one from
    epoch 2 on (epochs 0-based; without a key 0, epochs before the first key use 1). The trainer
    reads the schedule at the start of each train epoch and runs that epoch with the train step
    compiled for its count: each count is compiled once, the first time an epoch uses it, and
    kept, so a schedule going back to a count recompiles nothing. The count of an epoch follows
    from the epoch alone, so a run resumed mid-epoch (`ckpt_path="last"`) continues with the
    same count and equals an uninterrupted one. It cannot be combined with
    `Trainer(accumulate_grad_batches=k > 1)` (Lightning's error).

    Args:
        scheduling: `{epoch: accumulation factor}`, epochs ints >= 0, factors ints >= 1.

    Example:
        >>> import fitjax as fj
        >>> trainer = fj.Trainer(callbacks=[fj.GradientAccumulationScheduler(scheduling={0: 4, 2: 1})])
    """

    def __init__(self, scheduling: dict[int, int]):
        if not isinstance(scheduling, dict) or not scheduling:
            raise TypeError(f"GradientAccumulationScheduler(scheduling=...) must be a non-empty dict "
                            f"{{epoch: accumulation factor}}, e.g. {{0: 4, 2: 1}}; got {scheduling!r}.")
        if any(not _is_int(key) or key < 0 for key in scheduling):
            raise ValueError(f"GradientAccumulationScheduler(scheduling=...): epochs (keys) must be ints >= 0 "
                             f"(0-based), got {list(scheduling)}.")
        if any(not _is_int(value) or value < 1 for value in scheduling.values()):
            raise ValueError(f"GradientAccumulationScheduler(scheduling=...): accumulation factors (values) must "
                             f"be ints >= 1, got {list(scheduling.values())}.")
        self.scheduling = {0: 1, **scheduling}  # Lightning's: epochs before the first key use 1
        self.epochs = sorted(self.scheduling)

    def get_accumulate_grad_batches(self, epoch: int) -> int:
        """The accumulation factor of (0-based) train epoch `epoch`."""
        return self.scheduling[max(e for e in self.epochs if e <= epoch)]

    def going_to_accumulate_grad_batches(self) -> bool:
        """Whether some epoch accumulates more than one batch."""
        return any(value > 1 for value in self.scheduling.values())
