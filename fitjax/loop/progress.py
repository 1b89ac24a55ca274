"""Where the loop stands: one `Progress` object, owned and advanced by the `Trainer` only.

Callbacks read it through `trainer.progress`, a `ProgressView` with read-only properties, and
schedule themselves with `crossed(n)`: whether the last call of the train step passed a multiple
of `n` optimizer steps. A call may run several steps (`steps_per_execution`), so
`global_step % n == 0` would miss most multiples; `crossed` fires at the first step boundary at
or after each one (every 10 steps with 8 steps per call: at steps 16, 24, 32, 40, 56, ...).

The whole object is plain data (`state_dict()`): checkpoints store it as JSON and a resumed fit
continues from it.

Example:
    >>> import fitjax as fj
    >>> class EveryTen(fj.Callback):
    ...     def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
    ...         if trainer.progress.crossed(10):
    ...             print("passed", trainer.progress.global_step)
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

__all__ = ["Position", "Progress", "ProgressView"]

_RECENT_LOGGED = 16  # log windows kept for `recent_logged` (the loop has at most 4 on their way)


@dataclasses.dataclass(frozen=True)
class Position:
    """A point of the run: `epoch`, `batches_done` (train batches stepped in that epoch) and
    `step` (the global optimizer step count)."""

    epoch: int
    batches_done: int
    step: int

    def as_list(self) -> list[int]:
        return [self.epoch, self.batches_done, self.step]


def _position(value: Any) -> Position | None:
    return None if value is None else Position(*(int(v) for v in value))


class Progress:
    """The loop's position (mutable; the loop is its only writer).

    Attributes:
        epoch: the current epoch (0-based; Lightning's `current_epoch`).
        global_step: optimizer steps taken (Lightning's `global_step`).
        batches_done: train batches stepped in the current epoch.
        total_batches: train batches stepped in the whole run (every epoch).
        batches_in_epoch: train batches per epoch (after `limit_train_batches`); None when the
            data has no length.
        step_before / batches_before / total_before: the same counts before the last call of
            the train step (a call may run several batches and steps).
        last_logged / last_validated / last_saved: the `Position` of the last log window that
            reached the loggers, the last validation during fit, the last checkpoint.
        recent_logged: the last few log windows that reached the loggers, oldest first, each as
            (`Position`, the progress-bar values it logged, its steps per second or None):
            several can arrive at one step boundary, and a plain-line progress bar prints each
            (not saved in checkpoints).
        steps_per_second: optimizer steps per second over the last steps known finished on the
            device (`fitjax.loop._step_rate`; compilations and evaluations left out), None until
            measured (not saved in checkpoints).
        epoch_end_done: the current epoch's end work (epoch metrics, `on_train_epoch_end`)
            has started: a checkpoint taken now resumes at the next epoch.
    """

    def __init__(self) -> None:
        self.epoch = 0
        self.global_step = 0
        self.batches_done = 0
        self.total_batches = 0
        self.batches_in_epoch: int | None = None
        self.step_before = 0
        self.batches_before = 0
        self.total_before = 0
        self.last_logged: Position | None = None
        self.last_validated: Position | None = None
        self.last_saved: Position | None = None
        self._recent_logged: collections.deque[tuple[Position, dict[str, float], float | None]] = (
            collections.deque(maxlen=_RECENT_LOGGED))
        self._steps_per_second: float | None = None
        self.epoch_end_done = False

    # ------------------------------------------------------------------- the loop's writes

    def start_epoch(self, batches_done: int = 0) -> None:
        """A new epoch (or a resumed one, `batches_done` batches in)."""
        self.batches_done = self.batches_before = batches_done
        self.step_before = self.global_step
        self.total_before = self.total_batches
        self.epoch_end_done = False

    def advance(self, *, batches: int, steps: int) -> None:
        """One call of the train step ran `batches` batches as `steps` optimizer steps."""
        self.batches_before, self.batches_done = self.batches_done, self.batches_done + batches
        self.total_before, self.total_batches = self.total_batches, self.total_batches + batches
        self.step_before, self.global_step = self.global_step, self.global_step + steps

    def end_epoch(self) -> None:
        """The epoch's end work is done: the next epoch is current."""
        self.epoch += 1
        self.batches_done = self.batches_before = 0
        self.step_before = self.global_step
        self.total_before = self.total_batches
        self.epoch_end_done = False

    def logged(self, position: Position, bar_values: dict[str, float], rate: float | None = None) -> None:
        """A log window ending at `position` reached the loggers, with `bar_values` for the bar
        and its steps' speed (`rate`, steps per second, None when unknown)."""
        self.last_logged = position
        self._recent_logged.append((position, dict(bar_values), rate))

    def timed(self, rate: float) -> None:
        """The last finished steps ran at `rate` steps per second."""
        self._steps_per_second = rate

    @property
    def recent_logged(self) -> tuple[tuple[Position, dict[str, float], float | None], ...]:
        return tuple(self._recent_logged)

    @property
    def steps_per_second(self) -> float | None:
        return self._steps_per_second

    @property
    def position(self) -> Position:
        return Position(self.epoch, self.batches_done, self.global_step)

    # ------------------------------------------------------------------------ plain data

    def state_dict(self) -> dict[str, Any]:
        """The whole object as JSON-ready plain data."""
        out = {k: v for k, v in vars(self).items()
               if not isinstance(v, Position) and v is not None and not k.startswith("_")}
        for name in ("last_logged", "last_validated", "last_saved"):
            position = getattr(self, name)
            out[name] = None if position is None else position.as_list()
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name in ("epoch", "global_step", "batches_done", "total_batches", "step_before",
                     "batches_before", "total_before"):
            if name in state:
                setattr(self, name, int(state[name]))
        self.epoch_end_done = bool(state.get("epoch_end_done", False))
        for name in ("last_logged", "last_validated", "last_saved"):
            setattr(self, name, _position(state.get(name)))


def crossed(before: int, after: int, every: int | None) -> bool:
    """Whether a multiple of `every` lies in `(before, after]` (False for `every` None or 0)."""
    return bool(every) and after // every > before // every


class ProgressView:
    """A read-only view of the loop's `Progress` (what `trainer.progress` returns).

    Every attribute of `Progress` reads through; nothing can be set. `crossed(n)` and
    `crossed_batches(n)` answer the scheduling question of a callback for the last call of the
    train step.
    """

    __slots__ = ("_progress",)

    def __init__(self, progress: Progress) -> None:
        object.__setattr__(self, "_progress", progress)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name not in _READABLE:
            raise AttributeError(f"trainer.progress has no attribute {name!r}; it has {sorted(_READABLE)}")
        return getattr(self._progress, name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"trainer.progress is read-only (setting {name!r}); the loop owns it.")

    def __dir__(self) -> list[str]:
        return sorted(_READABLE | {"crossed", "crossed_batches"})

    def __repr__(self) -> str:
        return f"ProgressView({self._progress.state_dict()})"

    def crossed(self, every: int | None) -> bool:
        """Whether the last call of the train step passed a multiple of `every` optimizer steps:
        True at the first step boundary at or after each multiple (several steps per call)."""
        p = self._progress  # `crossed` inline: callbacks ask this every step
        return bool(every) and p.global_step // every > p.step_before // every

    def crossed_batches(self, every: int | None, *, across_epochs: bool = False) -> bool:
        """Whether the last call passed a multiple of `every` train batches, counted in the
        epoch (or over the whole run with `across_epochs`)."""
        p = self._progress
        if not every:
            return False
        if across_epochs:
            return p.total_batches // every > p.total_before // every
        return p.batches_done // every > p.batches_before // every

    @property
    def batch_idx(self) -> int:
        """The index in the epoch of the last batch stepped (-1 before the first)."""
        return self._progress.batches_done - 1

    # What the loop's metric log and schedule read at every call of the train step, as
    # properties: `__getattr__` runs only after the ordinary lookup has failed, an exception
    # raised and caught inside CPython, ~1 µs a read on CPU (issue 62: the loop's host time).
    @property
    def epoch(self) -> int:
        return self._progress.epoch

    @property
    def global_step(self) -> int:
        return self._progress.global_step

    @property
    def batches_done(self) -> int:
        return self._progress.batches_done


_READABLE = frozenset(k for k in vars(Progress()) if not k.startswith("_")) | {
    "position", "recent_logged", "steps_per_second", "state_dict"}  # state_dict: a copy
