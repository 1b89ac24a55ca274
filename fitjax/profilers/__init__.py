"""Profilers: where a fit spends its time (`Trainer(profiler="simple" | "jax" | a Profiler)`).

`SimpleProfiler` times the loop's phases on the host and prints a table when fit ends;
`JaxProfiler` records a `jax.profiler` trace of chosen steps for TensorBoard's profile tab.
With no profiler the loop's per-step path is unchanged.
"""

from __future__ import annotations

from fitjax.profilers._base import PassThroughProfiler, Profiler
from fitjax.profilers._jax_trace import JaxProfiler
from fitjax.profilers._simple import SimpleProfiler

# For the loop, not part of the user-facing API: compile times, logged as compile/<program>_s.
from fitjax.profilers._compile import CompileTimes

__all__ = ["JaxProfiler", "PassThroughProfiler", "Profiler", "SimpleProfiler", "resolve_profiler"]

_NAMES = {"simple": SimpleProfiler, "jax": JaxProfiler}


def resolve_profiler(profiler: str | Profiler | None) -> Profiler:
    """What `Trainer(profiler=...)` accepts, as a `Profiler`.

    Example:
        >>> type(resolve_profiler("simple")).__name__, type(resolve_profiler(None)).__name__
        ('SimpleProfiler', 'PassThroughProfiler')
    """
    if profiler is None:
        return PassThroughProfiler()
    if isinstance(profiler, Profiler):
        return profiler
    if isinstance(profiler, str) and profiler in _NAMES:
        return _NAMES[profiler]()
    raise ValueError(
        f"Trainer(profiler=...) must be None, 'simple' (host time per phase), 'jax' (a jax.profiler "
        f"trace for TensorBoard) or a fitjax.profilers.Profiler; got {profiler!r}. For a trace of "
        f"other steps pass fj.profilers.JaxProfiler(start_step=..., num_steps=...)."
    )
