"""A log window's train metrics, fetched without stalling the device.

At a log step the trainer starts copying the window's accumulators to the host and resets them on
the device, then keeps stepping. The values are read (and logged, with the step they belong to)
at the first step boundary where the copy has arrived, and at the latest when the next window
starts or when something needs them complete: the epoch's end, validation, a checkpoint.

Reading them at the log step itself (a blocking `device_get`) left the device idle while the host
woke up and logged: on CPU that cost the tiny MLP of `benchmarks/overhead.py` about 20% of its
speed with the default `log_every_n_steps=50`.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import numpy as np

from fitjax import step as step_lib
from fitjax.state import TrainState

__all__ = ["Window", "copies", "start"]


class Window:
    """One log window on its way to the host: the accumulators and the extra values logged at
    each log step (`fitjax.step.host_values`), with the loop position they were taken at.

    A plain class with slots, not a dataclass: made at most log steps (with several steps per
    call, most calls), where a frozen dataclass's `__init__` set each field through
    `object.__setattr__`."""

    __slots__ = ("step", "epoch", "batches_done", "values", "probe", "_host", "_flat")

    def __init__(self, step: int, epoch: int, batches_done: int, values: Any, probe: jax.Array | None,
                 flat: tuple[list, Any] | None = None) -> None:
        self.step, self.epoch, self.batches_done = step, epoch, batches_done
        self.values = values  # (accumulators, extra values): device arrays, copying to the host
        self.probe = probe  # one of them: one step computed them all
        self._host: tuple[dict, dict] | None = None  # read()'s, once read
        self._flat = flat  # `values` flattened once, when the copies start (`start`)

    def __repr__(self) -> str:
        return f"Window(step={self.step}, epoch={self.epoch}, batches_done={self.batches_done})"

    def ready(self) -> bool:
        """Whether reading the values would not wait (checked every step: one leaf, no tree walk)."""
        return self.probe is None or self.probe.is_ready()

    def read(self) -> tuple[dict, dict]:
        """The host values; waits for the step that computed them if it has not finished."""
        if self._host is None:
            # `jax.device_get` reads each leaf with its `__array__`, as `np.asarray` does, after
            # a tree walk, a copy started again and checks per leaf: ~50 µs of host CPU a window
            # in the loop of `benchmarks/overhead.py --only spe`, where most calls log
            leaves, treedef = self._flat if self._flat is not None else jax.tree.flatten(self.values)
            self._host = treedef.unflatten([np.asarray(leaf) for leaf in leaves])
        return self._host


def copies(metrics: Any) -> bool:
    """Whether a window's values are copied to the host ahead of their read (`start`): not when
    every accumulator is in the memory of CPU devices, which the read takes as it is. There
    `copy_to_host_async` only made a second copy, 5-17 µs of the main thread's CPU an array on
    XLA:CPU (and no faster a read: ~1.3 µs either way), where the tiny MLP's fit with 32 steps
    a call starts a window at 2 calls in 3 (`benchmarks/overhead.py --only spe`)."""
    return any(device.platform != "cpu" for leaf in jax.tree.leaves(metrics) for device in leaf.sharding.device_set)


def start(state: TrainState, reset: Callable[[TrainState], TrainState], *, step: int, epoch: int,
          batches_done: int, copy: bool = True) -> tuple[TrainState, Window]:
    """Starts fetching the window that ends at `step`; returns the state with its accumulators
    reset (`reset`) and the window. `copy=False`: the values are left where they are until read
    (`copies`)."""
    # the accumulators leave the state (replaced by zeros); the extra values stay in it, and the
    # next step donates the state, so those are copied
    extra = step_lib.host_values(state)
    if extra:  # most states have none (no loss scale)
        extra = jax.tree.map(lambda x: x.copy(), extra)
    values = (state.metrics, extra)
    leaves, treedef = jax.tree.flatten(values)
    if copy:
        for leaf in leaves:
            leaf.copy_to_host_async()
    return reset(state), Window(step, epoch, batches_done, values, leaves[0] if leaves else None,
                                (leaves, treedef))
