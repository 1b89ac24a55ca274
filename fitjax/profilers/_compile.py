"""Compile time per program, from the duration events JAX records for each compilation.

JAX reports, per jitted function name, the time to trace it, to lower it to MLIR and to compile
it with XLA (or fetch it from the persistent cache). The listener runs only when JAX compiles,
so a fit pays nothing per step for it.
"""

from __future__ import annotations

import collections
import re
import threading

import jax

from fitjax import _status

__all__ = ["CompileTimes"]

# A compilation is traced, lowered, then compiled: three events, one entry per compilation.
_BEFORE_COMPILE = frozenset({"/jax/core/compile/jaxpr_trace_duration",
                             "/jax/core/compile/jaxpr_to_mlir_module_duration"})
_COMPILE = "/jax/core/compile/backend_compile_duration"
#: Programs compiled faster than this are logged together as `compile/other_s`.
MIN_SECONDS = 0.1
_NOT_IN_KEY = re.compile(r"[^A-Za-z0-9_]+")
_WRAPPED = re.compile(r"(?:jit|pjit|pmap)\((.*)\)")  # JAX names the lowering "jit(<function>)"
_TRACE = "/jax/core/compile/jaxpr_trace_duration"
# The step programs fitjax builds (`fitjax.step`), as their status lines name them; their first
# compilations are the slow, silent parts of a fit's start after the init. A train step compiled
# on its own for XLA's FLOP count (read before any step ran, or the step without remat for
# `ThroughputMonitor`'s MFU) is said as that, not as a recompilation.
_STEPS = {"train_step": "the train step", "eval_step": "the evaluation step", "predict_step": "the predict step"}
_COUNTS = {"train_step_flops": "the train step's FLOPs"}


def program_key(fun_name: str) -> str:
    """A jitted function's name as a metric key part: `compile/<program>_s`.

    Example:
        >>> program_key("jit(train_step)"), program_key("<lambda>")
        ('train_step', 'lambda')
    """
    wrapped = _WRAPPED.fullmatch(fun_name)
    if wrapped:
        fun_name = wrapped.group(1)
    return _NOT_IN_KEY.sub("_", fun_name).strip("_") or "program"


class CompileTimes:
    """Collects compile seconds per program while entered (re-entrant use is not supported).

    Example:
        >>> def add_one(x):
        ...     return x + 1
        >>> with CompileTimes() as times:
        ...     _ = jax.jit(add_one)(1.0)
        >>> list(times.take_each())
        ['add_one']
    """

    def __init__(self) -> None:
        self._seconds: dict[str, list[float]] = collections.defaultdict(list)  # one entry per compilation
        self._pending: dict[str, float] = collections.defaultdict(float)  # traced and lowered, not compiled yet
        self._lock = threading.Lock()
        self._active = False
        self.seconds_total = 0.0  # every compilation's seconds so far (never taken: a clock to subtract)

    def _listen(self, event: str, duration: float, **kwargs) -> None:
        if event != _COMPILE and event not in _BEFORE_COMPILE:
            return
        name = program_key(str(kwargs.get("fun_name", "program")))
        with self._lock:
            self.seconds_total += duration
            if event == _COMPILE:  # the compilation's trace and lowering join it
                self._seconds[name].append(self._pending.pop(name, 0.0) + duration)
                seconds = self._seconds[name][-1]
            else:
                self._pending[name] += duration
        if name in _STEPS:  # said on the compiling thread, as it happens: traced, then compiled
            if event == _TRACE:
                _status.step_compiling(_STEPS[name])
            elif event == _COMPILE:
                _status.step_compiled(_STEPS[name], seconds)
        elif name in _COUNTS:
            if event == _TRACE:
                _status.step_counting(_COUNTS[name])
            elif event == _COMPILE:
                _status.step_counted(_COUNTS[name], seconds)

    def __enter__(self) -> CompileTimes:
        if not self._active:
            jax.monitoring.register_event_duration_secs_listener(self._listen)
            self._active = True
        return self

    def __exit__(self, *exc) -> None:
        if self._active:
            jax.monitoring.unregister_event_duration_listener(self._listen)
            self._active = False

    def take(self) -> dict[str, float]:
        """`{"compile/<program>_s": seconds}` since the last take, each program's compilations
        summed; programs under `MIN_SECONDS` (JAX's eager one-op programs, mostly) are summed
        into `compile/other_s`."""
        logged: dict[str, float] = {}
        if not self._seconds and not self._pending:  # every row but a few (read without the lock:
            return logged  # a compilation recorded meanwhile is taken with the next row)
        other = 0.0
        for name, values in self.take_each().items():
            if sum(values) >= MIN_SECONDS:
                logged[f"compile/{name}_s"] = sum(values)
            else:
                other += sum(values)
        if other:
            logged["compile/other_s"] = other
        return logged

    def take_each(self) -> dict[str, list[float]]:
        """Each program's compilations since the last take: one entry per XLA compilation, its
        trace, lowering and compile seconds together (a program traced or lowered but not
        compiled, as for a cost analysis, adds its seconds to its last entry, or is one)."""
        with self._lock:
            taken, self._seconds = self._seconds, collections.defaultdict(list)
            pending, self._pending = self._pending, collections.defaultdict(float)
        for name, seconds in pending.items():
            entries = taken[name]
            if entries:
                entries[-1] += seconds
            else:
                entries.append(seconds)
        return dict(taken)
