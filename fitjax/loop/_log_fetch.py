"""A log window's train metrics, fetched without stalling the device.

At a log step the trainer takes the window's accumulators out of the state (zeros in their
place) and keeps stepping. The values are read (and logged, with the step they belong to) at the
first step boundary where they have arrived, and at the latest when something needs them
complete: the epoch's end, validation, a checkpoint, too many windows on their way.

Reading them at the log step itself (a blocking `device_get`) left the device idle while the host
woke up and logged: on CPU that cost the tiny MLP of `benchmarks/overhead.py` about 20% of its
speed with the default `log_every_n_steps=50`.

On an accelerator every transfer to the host costs the host far more than its few bytes: on a
TPU v5e chip ~290 µs of host time a window copied and read alone, where `steps_per_execution=32`
with the default `log_every_n_steps=50` starts a window at two calls in three
(`benchmarks/window_fetch.py`). Windows that come fast (less than `HOLD_SECONDS` apart) are
therefore held on the device and sent `STACKED` at a time, stacked by one small program into one
array per leaf, copied and read once: ~60 µs a window there. A held window is sent at the latest
`HOLD_SECONDS` after the first of its stack was taken (the progress bar's values are that much
later at most), or when it is read. Windows that come slowly go one by one, as they always did.
"""

from __future__ import annotations

import collections
import math
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from fitjax import step as step_lib
from fitjax.state import TrainState

__all__ = ["HOLD_SECONDS", "STACKED", "Fetcher", "Window", "copies"]

#: windows sent to the host together at most (one program stacks them)
STACKED = 16
#: a window taken less than this after the one before is held, to be sent with others; a held
#: window waits this long at most
HOLD_SECONDS = 0.25
# a window holding more bytes than this always goes alone (stacks are meant for a few scalars)
_STACK_BYTES = 1 << 16


class Window:
    """One log window on its way to the host: the accumulators and the extra values logged at
    each log step (`fitjax.step.host_values`), with the loop position they were taken at.

    A plain class with slots, not a dataclass: made at most log steps (with several steps per
    call, most calls), where a frozen dataclass's `__init__` set each field through
    `object.__setattr__`."""

    __slots__ = ("step", "epoch", "batches_done", "values", "probe", "_host", "_flat", "_stack", "_index")

    def __init__(self, step: int, epoch: int, batches_done: int, values: Any, probe: jax.Array | None,
                 flat: tuple[list, Any] | None = None) -> None:
        self.step, self.epoch, self.batches_done = step, epoch, batches_done
        self.values = values  # (accumulators, extra values): device arrays, copying to the host
        self.probe = probe  # one of them: one step computed them all
        self._host: tuple[dict, dict] | None = None  # read()'s, once read
        self._flat = flat  # `values` flattened once, when the copies start
        self._stack: _Stack | None = None  # the stack it is sent in, if held
        self._index = 0  # its place there

    def __repr__(self) -> str:
        return f"Window(step={self.step}, epoch={self.epoch}, batches_done={self.batches_done})"

    def ready(self) -> bool:
        """Whether reading the values would not wait (checked every step: one leaf, no tree walk).
        A held window is never ready before it is sent, which this sends when it is due."""
        if self._stack is not None:
            return self._stack.ready()
        return self.probe is None or self.probe.is_ready()

    def read(self) -> tuple[dict, dict]:
        """The host values; waits for the step that computed them if it has not finished."""
        if self._host is None:
            if self._stack is not None:
                self._host = self._stack.read(self._index)
            else:
                # `jax.device_get` reads each leaf with its `__array__`, as `np.asarray` does,
                # after a tree walk, a copy started again and checks per leaf: ~50 µs of host CPU
                # a window in the loop of `benchmarks/overhead.py --only spe`
                leaves, treedef = self._flat if self._flat is not None else jax.tree.flatten(self.values)
                self._host = treedef.unflatten([np.asarray(leaf) for leaf in leaves])
        return self._host


def copies(metrics: Any) -> bool:
    """Whether a window's values are copied to the host ahead of their read: not when every
    accumulator is in the memory of CPU devices, which the read takes as it is. There
    `copy_to_host_async` only made a second copy, 5-17 µs of the main thread's CPU an array on
    XLA:CPU (and no faster a read: ~1.3 µs either way), where the tiny MLP's fit with 32 steps
    a call starts a window at 2 calls in 3 (`benchmarks/overhead.py --only spe`)."""
    return any(device.platform != "cpu" for leaf in jax.tree.leaves(metrics) for device in leaf.sharding.device_set)


class Fetcher:
    """Starts a fit's windows on their way (`start`): alone, or held and stacked (module
    docstring).

    Args:
        copy: copy each window's values to the host ahead of their read (`copies`).
        stack: hold windows that come fast and send them stacked; only with `copy`, in one
            process (a stack of arrays of several processes is not readable on one).
        ahead: with `stack`, how many windows the host may take before the device has computed
            the oldest of them: the caller's bound on windows in flight, which reads the oldest
            window when it is reached, bounds this only when windows go alone.
        clock: the clock (seconds).
    """

    def __init__(self, *, copy: bool, stack: bool, ahead: int = 4,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self._copy, self._stack, self._clock = copy, stack and copy, clock
        self._open: _Stack | None = None  # the stack held windows join
        self._last = -math.inf  # when the last window was taken
        # the newest windows' probes: the host waits for the oldest before taking one more, so it
        # runs at most `ahead` windows (their steps and batches) ahead of the device, as when
        # each window was read at the bound
        self._recent: collections.deque = collections.deque(maxlen=ahead)

    @classmethod
    def for_values(cls, values: Any, *, ahead: int) -> Fetcher:
        """The fetcher for windows of `values` (the state's accumulators and extra values)."""
        copy = copies(values)
        small = sum(leaf.nbytes for leaf in jax.tree.leaves(values)) <= _STACK_BYTES
        return cls(copy=copy, stack=small and jax.process_count() == 1, ahead=ahead)

    @property
    def windows_in_flight(self) -> int:
        """How many windows may be on their way before the oldest is read: a stack's worth more
        when windows are stacked (each stack is one transfer)."""
        return STACKED if self._stack else 1

    def start(self, state: TrainState, reset: Callable[[TrainState], TrainState], *, step: int, epoch: int,
              batches_done: int) -> tuple[TrainState, Window]:
        """Starts fetching the window that ends at `step`; returns the state with its accumulators
        reset (`reset`) and the window."""
        # the accumulators leave the state (replaced by zeros); the extra values stay in it, and
        # the next step donates the state, so those are copied
        extra = step_lib.host_values(state)
        if extra:  # most states have none (no loss scale)
            extra = jax.tree.map(lambda x: x.copy(), extra)
        values = (state.metrics, extra)
        leaves, treedef = jax.tree.flatten(values)
        window = Window(step, epoch, batches_done, values, leaves[0] if leaves else None, (leaves, treedef))
        now, last = self._clock(), self._last
        self._last = now
        if leaves and self._stack and (self._open is not None and not self._open.sent or now - last < HOLD_SECONDS):
            recent = self._recent
            if len(recent) == recent.maxlen:
                recent[0].block_until_ready()  # at once where the device keeps up (the host-bound loops)
            recent.append(window.probe)
            if self._open is None or self._open.sent:
                self._open = _Stack(due=now + HOLD_SECONDS, clock=self._clock)
            self._open.hold(window)
        elif self._copy:
            for leaf in leaves:
                leaf.copy_to_host_async()
        return reset(state), window


class _Stack:
    """Windows held on the device, sent to the host as one stacked array per leaf."""

    __slots__ = ("windows", "due", "sent", "_clock", "_leaves", "_treedef", "_host", "_alone")

    def __init__(self, *, due: float, clock: Callable[[], float]) -> None:
        self.windows: list[Window] = []
        self.due, self.sent, self._clock = due, False, clock
        self._leaves: list | None = None  # the stacked leaves, once sent
        self._treedef = None
        self._host: list | None = None  # their host values, once read
        self._alone = False  # one window held: sent as it is, not stacked

    def hold(self, window: Window) -> None:
        window._stack, window._index = self, len(self.windows)
        self.windows.append(window)
        if len(self.windows) == STACKED:
            self.send()

    def send(self) -> None:
        """Stacks the held windows (padded to `STACKED` with the last: one program for any
        number) and starts copying the stack to the host; one window goes as it is."""
        if len(self.windows) == 1:  # e.g. an epoch's last steps, held and read at its end
            self._alone = True
            self._leaves, self._treedef = self.windows[0]._flat
        else:
            values = [window.values for window in self.windows]
            values += [values[-1]] * (STACKED - len(values))
            self._leaves, self._treedef = jax.tree.flatten(_stacked(tuple(values)))
        for leaf in self._leaves:
            leaf.copy_to_host_async()
        self.sent = True

    def ready(self) -> bool:
        if not self.sent:
            if self._clock() < self.due:
                return False
            self.send()
        return self._leaves[0].is_ready()

    def read(self, index: int) -> tuple[dict, dict]:
        """The host values of the window at `index` (sends the stack first if it is held)."""
        if not self.sent:
            self.send()
        if self._host is None:
            self._host = [np.asarray(leaf) for leaf in self._leaves]
        return self._treedef.unflatten(self._host if self._alone else [leaf[index] for leaf in self._host])


@jax.jit
def _stacked(windows: tuple) -> Any:
    return jax.tree.map(lambda *leaves: jnp.stack(leaves), *windows)
