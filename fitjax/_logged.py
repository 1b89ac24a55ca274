"""What `LitModule.log` records while the trainer traces `loss` and `metrics`.

`step.py` opens a `collecting()` block around each traced user call; `LitModule.log` adds a
value to the innermost open block. The values are tracers of the step being traced, so they leave
it as extra outputs of the jitted function and are accumulated on device with the other metrics:
no callback, no host transfer. The options (`prog_bar`, `on_step`, ...) are static Python facts,
recorded once per trace and read by the trainer when it logs.

Any code path that traces user code (a Lightning-style `training_step`, say) can reuse this: open
`collecting()` around the call and merge the returned values into the step's metrics.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from typing import Any, Iterator

__all__ = ["LogSpec", "Logged", "collecting", "record"]

REDUCE_FX = ("mean",)


@dataclasses.dataclass(frozen=True)
class LogSpec:
    """How a value passed to `LitModule.log` is shown and logged (static, fixed at trace time)."""

    prog_bar: bool = False
    on_step: bool | None = None  # None: the stage's default (train: window and epoch; eval: epoch)
    on_epoch: bool | None = None
    reduce_fx: str = "mean"


class Logged:
    """The values and specs recorded inside one `collecting()` block, in call order."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.specs: dict[str, LogSpec] = {}


_CURRENT: contextvars.ContextVar[Logged | None] = contextvars.ContextVar("fitjax_logged", default=None)


@contextlib.contextmanager
def collecting() -> Iterator[Logged]:
    """Collects what `LitModule.log` records inside the block (nested blocks shadow outer ones)."""
    logged = Logged()
    token = _CURRENT.set(logged)
    try:
        yield logged
    finally:
        _CURRENT.reset(token)


def record(owner: str, name: Any, value: Any, spec: LogSpec) -> None:
    """Adds `value` under `name` to the open block; raises when none is open or `name` repeats."""
    if not isinstance(name, str) or not name or name == "loss":
        raise ValueError(
            f"{owner}.log(name=...) must be a non-empty string other than 'loss' (the loss is logged "
            f"for you), got {name!r}."
        )
    if spec.reduce_fx not in REDUCE_FX:
        raise ValueError(
            f"{owner}.log({name!r}, reduce_fx=...) must be one of {REDUCE_FX}, got {spec.reduce_fx!r}. "
            "Values are averaged over examples on device; compute other reductions inside `metrics`."
        )
    for option in ("on_step", "on_epoch"):
        if getattr(spec, option) not in (None, True, False):
            raise ValueError(f"{owner}.log({name!r}, {option}=...) must be None or a bool, "
                             f"got {getattr(spec, option)!r}.")
    logged = _CURRENT.get()
    if logged is None:
        raise RuntimeError(
            f"{owner}.log({name!r}, ...) was called outside `loss` and `metrics`. It records values "
            "computed while the trainer traces those two methods; read host values in hooks from "
            "`trainer.callback_metrics` instead, or log them with `trainer.logger.log_metrics`."
        )
    if name in logged.values:
        raise ValueError(f"{owner}.log({name!r}, ...) was called twice in one step; use distinct names.")
    logged.values[name] = value
    logged.specs[name] = spec


def keep(values: dict[str, Any], specs: dict[str, LogSpec], option: str) -> dict[str, Any]:
    """`values` without the logged names whose `option` ("on_step" or "on_epoch") is False."""
    return {k: v for k, v in values.items() if getattr(specs.get(k), option, None) is not False}


def for_progress_bar(values: dict[str, float], specs: dict[str, LogSpec]) -> dict[str, float]:
    """The losses and the values logged with `prog_bar=True`: what a progress bar shows."""
    def marked(key: str) -> bool:
        name = key.split("/", 1)[-1]
        return name == "loss" or getattr(specs.get(name), "prog_bar", False)

    return {k: v for k, v in values.items() if marked(k)}
