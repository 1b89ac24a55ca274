"""Optimizer steps per second, counted from steps the device has finished.

The host returns from a step's call as soon as the step is queued (asynchronous dispatch), so
timing the calls measures how fast the host queues steps: on a small model that was 9-27x the
speed the device trains at. The loop knows a step has finished at a few points only: when a log
window's values have reached the host (`_log_fetch.Window`) and when it waited for them (before
a validation, at an epoch's end). The rate is measured between two such points, so it is the
speed of finished steps, host waits included. Nothing is added to a step: the clock is read when
a window is written.

Compilation is left out by subtracting the compile seconds JAX reported in between (the device
waits for a compilation: a step is compiled before it runs), and evaluations by restarting the
clock after them (`restart`), when every train step before has finished.
"""

from __future__ import annotations

import time
from typing import Callable

__all__ = ["StepRate"]


class StepRate:
    """The optimizer steps per second between the last two points where steps were known done.

    Args:
        compile_seconds: the compile seconds so far (`CompileTimes.seconds_total`), subtracted.
        clock: the clock (seconds).

    Example:
        >>> now, compiled = [0.0], [0.0]
        >>> rate = StepRate(lambda: compiled[0], clock=lambda: now[0])
        >>> rate.restart(step=0)
        >>> now[0], compiled[0] = 3.0, 1.0   # 1 s of it compiled the step
        >>> rate.done(step=100)
        50.0
    """

    def __init__(self, compile_seconds: Callable[[], float], *, clock: Callable[[], float] = time.perf_counter):
        self._compile_seconds = compile_seconds
        self._clock = clock
        self._since: tuple[float, int, float] | None = None  # (time, step, compile seconds) of the last point
        self.latest: float | None = None  # the last interval's steps per second

    def restart(self, *, step: int) -> None:
        """Every step up to `step` has finished and the time until now was not training (an
        evaluation, the work between epochs): the next interval starts now."""
        self._since = (self._clock(), step, self._compile_seconds())

    def done(self, *, step: int) -> float | None:
        """Every step up to `step` has finished now; returns the steps per second since the last
        point (None before a first point, or when no step was taken since)."""
        now, compiled = self._clock(), self._compile_seconds()
        since, self._since = self._since, (now, step, compiled)
        if since is None or step <= since[1]:
            return None
        elapsed = (now - since[0]) - (compiled - since[2])
        if elapsed <= 0:  # a compilation overlapped steps still running: no honest figure
            return None
        self.latest = (step - since[1]) / elapsed
        return self.latest
