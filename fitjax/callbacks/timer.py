"""`Timer`: Lightning's time limit for training, and the clock behind `Trainer(max_time=...)`.

The time is counted from `on_train_start` (host monotonic clock) and, on resume, continues from
the elapsed training time the checkpoint stored. The check is a clock read per train batch
(`interval="step"`) or per epoch: no device work, no sync. With several processes each host
reads its own clock and sets `trainer.should_stop`; the loop makes every process stop at the
same step (`Trainer.agree` at its sync points), which Lightning does by broadcasting rank 0's
answer at every step instead.
"""

from __future__ import annotations

import datetime
import logging
import re
import time
from typing import Any, Iterable, Union

from fitjax.callbacks._base import Callback, ignores_batch

__all__ = ["Timer", "parse_duration", "with_timer"]

log = logging.getLogger("fitjax")

Duration = Union[str, datetime.timedelta, dict]
STAGES = ("train", "sanity_check", "validate", "test", "predict")  # Lightning's RunningStage values
INTERVALS = ("step", "epoch")
_DDHHMMSS = re.compile(r"(\d+):(\d\d):(\d\d):(\d\d)")


def parse_duration(value: Duration | None, *, where: str) -> datetime.timedelta | None:
    """Lightning's duration forms as a `timedelta`: "DD:HH:MM:SS", a `timedelta`, or a dict of
    `timedelta` keywords ({"hours": 1}); None stays None. `where` names the argument in errors."""
    if value is None or isinstance(value, datetime.timedelta):
        return value
    if isinstance(value, str):
        match = _DDHHMMSS.fullmatch(value.strip())
        if not match:
            raise ValueError(f"{where}={value!r} is not a valid duration: expected a string "
                             "'DD:HH:MM:SS' (e.g. '00:12:00:00' for 12 hours), a datetime.timedelta or "
                             "a dict such as {'hours': 12}.")
        days, hours, minutes, seconds = map(int, match.groups())
        return datetime.timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
    if isinstance(value, dict):
        try:
            return datetime.timedelta(**value)
        except TypeError as error:
            raise ValueError(f"{where}={value!r}: the dict's keys must be datetime.timedelta's "
                             f"arguments (days, hours, minutes, seconds, ...): {error}") from None
    raise TypeError(f"{where} takes a 'DD:HH:MM:SS' string, a datetime.timedelta or a dict of its "
                    f"arguments, got {type(value).__name__}: {value!r}")


class Timer(Callback):
    """Stops training once `duration` of training time has passed (Lightning's `Timer`).

    The stop is a normal one (`trainer.should_stop`, obeyed after `min_epochs`/`min_steps`):
    between two batches of an epoch the checkpoint callbacks save there and a fit resumed from
    that checkpoint finishes the epoch (its validation and end run once, at its real end). The
    elapsed training time is stored in checkpoints, so a resumed fit stops when the total is
    reached.

    Args:
        duration: "DD:HH:MM:SS", a `datetime.timedelta` or a dict of its arguments; None only
            measures (`time_elapsed`).
        interval: check after every train batch ("step") or at each epoch's end ("epoch").
        verbose: log a line (the "fitjax" logger, INFO) when the limit is reached.

    Example:
        >>> import fitjax as fj
        >>> timer = fj.Timer(duration="00:12:00:00")       # or Trainer(max_time="00:12:00:00")
        >>> trainer = fj.Trainer(callbacks=[timer])
        >>> # trainer.fit(...); timer.time_elapsed("train"), timer.time_remaining()
    """

    def __init__(self, duration: Duration | None = None, interval: str = "step", verbose: bool = True):
        duration = parse_duration(duration, where="Timer(duration=...)")
        if interval not in INTERVALS:
            raise ValueError(f"Timer(interval=...) must be one of {INTERVALS}, got {interval!r}")
        self._duration = duration.total_seconds() if duration is not None else None
        self._interval = interval
        self._verbose = bool(verbose)
        self._start_time: dict[str, float | None] = dict.fromkeys(STAGES)
        self._end_time: dict[str, float | None] = dict.fromkeys(STAGES)
        self._offset = 0.0  # training seconds of the run a resumed fit continues

    # ------------------------------------------------------------------------------ reads

    def start_time(self, stage: str = "train") -> float | None:
        """When `stage` started (`time.monotonic()`), or None."""
        return self._start_time[_stage(stage)]

    def end_time(self, stage: str = "train") -> float | None:
        """When `stage` ended (`time.monotonic()`), or None while it runs or before it."""
        return self._end_time[_stage(stage)]

    def time_elapsed(self, stage: str = "train") -> float:
        """Seconds `stage` has run (for "train", including the resumed run's)."""
        start, end = self.start_time(stage), self.end_time(stage)
        offset = self._offset if stage == "train" else 0.0
        if start is None:
            return offset
        return (time.monotonic() if end is None else end) - start + offset

    def time_remaining(self, stage: str = "train") -> float | None:
        """Seconds left of `duration` (negative once passed), or None without a duration."""
        return None if self._duration is None else self._duration - self.time_elapsed(stage)

    # ------------------------------------------------------------------------------ hooks

    def on_train_start(self, trainer, module) -> None:
        self._start_time["train"], self._end_time["train"] = time.monotonic(), None

    def on_train_end(self, trainer, module) -> None:
        self._end_time["train"] = time.monotonic()

    def on_validation_start(self, trainer, module) -> None:
        self._start_time["validate"], self._end_time["validate"] = time.monotonic(), None

    def on_validation_end(self, trainer, module) -> None:
        self._end_time["validate"] = time.monotonic()

    def on_test_start(self, trainer, module) -> None:
        self._start_time["test"], self._end_time["test"] = time.monotonic(), None

    def on_test_end(self, trainer, module) -> None:
        self._end_time["test"] = time.monotonic()

    def on_fit_start(self, trainer, module) -> None:
        # after a resume's state is loaded: a run whose time is already spent trains no step
        if self._duration is not None:
            self._check_time_remaining(trainer)

    @ignores_batch
    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        if self._interval == "step" and self._duration is not None:
            self._check_time_remaining(trainer)

    def on_train_epoch_end(self, trainer, module) -> None:
        if self._interval == "epoch" and self._duration is not None:
            self._check_time_remaining(trainer)

    def _check_time_remaining(self, trainer) -> None:
        if self.time_elapsed("train") < self._duration:
            return
        if self._verbose and not trainer.should_stop and trainer.is_global_zero:
            elapsed = datetime.timedelta(seconds=int(self.time_elapsed("train")))
            log.info("Time limit reached. Elapsed time is %s. Signaling Trainer to stop.", elapsed)
        trainer.should_stop = True

    # ------------------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        return {"time_elapsed": {stage: self.time_elapsed(stage) for stage in STAGES}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._offset = float(state.get("time_elapsed", {}).get("train", 0.0))


def _stage(stage: str) -> str:
    if stage not in STAGES:
        raise ValueError(f"Timer: stage must be one of {STAGES}, got {stage!r}")
    return stage


def with_timer(callbacks: Iterable[Callback], max_time: Duration | None) -> list[Callback]:
    """`Trainer(max_time=...)`: a `Timer(duration=max_time, interval="step")` added to the
    callbacks, unless they hold a `Timer` already (Lightning's rule: that one wins, said at INFO)."""
    callbacks = list(callbacks)
    duration = parse_duration(max_time, where="Trainer(max_time=...)")
    if duration is None:
        return callbacks
    if any(isinstance(cb, Timer) for cb in callbacks):
        log.info("Ignoring `Trainer(max_time=...)`, callbacks list already contains a Timer.")
        return callbacks
    return [*callbacks, Timer(duration=duration, interval="step")]
