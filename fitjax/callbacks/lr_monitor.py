"""`LearningRateMonitor`: logs the learning rate the optimizer actually applied, as `lr`.

Where the value comes from (in this order):

1. `optax.inject_hyperparams` states anywhere in the optimizer state: their
   `hyperparams["learning_rate"]` is the value the last update used (optax evaluates the schedule
   at the update's count and stores it). Exact for any schedule; one key per such state
   (`lr/<group>` for the groups of `optax.multi_transform`). This is the recommended way.
2. Otherwise the module's `lr_schedule` attribute (a schedule `count -> lr`, or a number),
   evaluated at the optimizer's own update count (found in the state: a `ScaleByScheduleState`
   first, else any `count` field), so gradient accumulation's skipped updates are not counted.
   The schedule is jitted once and run on the host's CPU device: one small compilation at the
   first log step and ~10 µs a read, where evaluating it eagerly compiled each of its ~12
   operations on the accelerator (~0.06 s each on a TPU v5e) and dispatched them there at
   every log step. Jitted, it is also the rate the step applied bit for bit (on CPU: the step
   evaluates it jitted too), where the eager evaluation differed in the last bits.

optax transformations keep their schedule in a closure, out of reach, so without either of those
the monitor raises when training starts and says how to expose the value. Reading it is one small
extra transfer per log step (a few scalars), never a sync on steps that are not logged.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import numpy as np

from fitjax.callbacks._base import Callback, ignores_batch, ignores_outputs
from fitjax.step import learning_rate as lr_lib
from fitjax.step.learning_rate import update_count

__all__ = ["LearningRateMonitor"]

_INTERVALS = ("step", "epoch", None)


def injected_learning_rates(opt_state: Any) -> dict[str, jax.Array]:
    """`{"lr": value}` or `{"lr/<group>": value, ...}` from `inject_hyperparams` states."""
    found = lr_lib.named(opt_state)
    if len(found) == 1:
        return {"lr": found[0][1]}
    return {f"lr/{group}": value for group, value in found}


# what jitting a schedule that branches on its count in Python raises (it is then called eagerly)
_UNTRACEABLE = (jax.errors.ConcretizationTypeError, jax.errors.TracerIntegerConversionError,
                jax.errors.TracerArrayConversionError)


def _on_host(schedule: Callable[[Any], Any]) -> Callable[[int], float]:
    """`schedule` as a host function `count -> lr`, jitted on the host's CPU device (the module
    docstring says why), compiled at its first call; called as it is where it cannot be traced
    (`lambda count: 0.1 if count < 100 else 0.01`)."""
    jitted: Callable[[Any], Any] | None = jax.jit(schedule)
    try:
        cpu = jax.local_devices(backend="cpu")[0]
    except RuntimeError:  # JAX_PLATFORMS without "cpu": the default device runs it
        cpu = None

    def at(count: int) -> float:
        nonlocal jitted
        with jax.default_device(cpu):
            if jitted is not None:
                try:  # a Python int is a weakly typed argument, as in the eager call it replaces
                    return float(np.asarray(jitted(count)))
                except _UNTRACEABLE:
                    jitted = None
            return float(np.asarray(schedule(count)))

    return at


class LearningRateMonitor(Callback):
    """Logs the learning rate applied at each logged step (`lr`, or `lr/<group>` per group).

    Wrap the optimizer with `optax.inject_hyperparams` for an exact read of any schedule, e.g.
    `optax.inject_hyperparams(optax.adamw)(learning_rate=schedule)`, or set `self.lr_schedule =
    schedule` on the module (see the module docstring for how each is read).

    Args:
        logging_interval: "step" (default; every `log_every_n_steps`, the value applied at that
            step) or "epoch" (at each epoch end, the value applied at its last step).

    Attributes:
        history: `{key: [(global_step, lr), ...]}` of everything logged.

    Example:
        >>> import fitjax as fj
        >>> trainer = fj.Trainer(callbacks=[fj.LearningRateMonitor()], log_every_n_steps=10)
    """

    def __init__(self, logging_interval: str | None = "step"):
        if logging_interval not in _INTERVALS:
            raise ValueError(
                f"LearningRateMonitor(logging_interval=...) must be one of {_INTERVALS}, got {logging_interval!r}"
            )
        self.logging_interval = logging_interval or "step"
        self.history: dict[str, list[tuple[int, float]]] = {}
        self._schedule: Callable[[Any], Any] | None = None

    def on_train_start(self, trainer, module) -> None:
        self._schedule = None
        if lr_lib.count(trainer.state.opt_state):
            return
        schedule = getattr(module, "lr_schedule", None)
        if isinstance(schedule, (int, float)) and not isinstance(schedule, bool):
            value = float(schedule)
            self._schedule = lambda count: value
        elif callable(schedule):
            self._schedule = _on_host(schedule)
        else:
            raise ValueError(
                f"LearningRateMonitor cannot find the learning rate of {type(module).__name__}'s "
                "optimizer: optax keeps schedules out of the optimizer state. Either wrap the "
                f"optimizer, `{lr_lib.example('schedule')}`, or set "
                f"`self.lr_schedule = schedule` (a callable or a number) on the module; got "
                f"lr_schedule={schedule!r}."
            )

    @ignores_outputs
    @ignores_batch
    def on_train_batch_end(self, trainer, module, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.logging_interval == "step" and trainer.progress.crossed(trainer.log_every_n_steps):
            self._log(trainer, module)

    def on_train_epoch_end(self, trainer, module) -> None:
        if self.logging_interval == "epoch":
            self._log(trainer, module)

    def current(self, trainer) -> dict[str, float]:
        """The learning rates of the last update, as host floats (one small transfer)."""
        opt_state = trainer.state.opt_state
        if self._schedule is None:
            return {k: float(v) for k, v in jax.device_get(injected_learning_rates(opt_state)).items()}
        count = update_count(opt_state)
        count = trainer.global_step if count is None else int(jax.device_get(count))
        return {"lr": float(self._schedule(max(count - 1, 0)))}

    def _log(self, trainer, module) -> None:
        values = self.current(trainer)
        for key, value in values.items():
            self.history.setdefault(key, []).append((trainer.global_step, value))
        module.log_dict(values)  # the loggers and `callback_metrics` (monitorable, as in Lightning)
