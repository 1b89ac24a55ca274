"""The platform a program is traced for, which may not be the process's.

A choice made while tracing (which attention kernel `fj.nn.attention` runs, whether a Pallas
kernel is interpreted) must follow the devices the program is compiled for. Usually those are
the process's default backend's; the planner's TPU targets are not: `fitjax plan --target
tpu-v5e-1` compiles on a CPU machine for a TPU topology without a TPU (`xla_tpu.deviceless_topology`),
and a model traced there by `jax.default_backend()` ("cpu") would plan XLA's attention, whose
[batch, heads, length, length] scores the chip never holds (GPT-2 medium, 8 rows: 19.8 GB of
temporaries planned for a step that runs on a 16 GB chip).

`Strategy.jit`, through which every fitjax program is compiled (`fitjax.step.compiling.jit`: the
train, evaluation and predict steps the planner compiles, generation's programs, ...), traces its
function under `tracing_for(strategy.platform)`; `traced_platform()` reads it, and is the default
backend elsewhere: a user's own `jax.jit`, and the state's init, which runs on the process's own
devices (wrapping the init's function as well made the module's loss traced once more per fit:
`tests/loop/test_setup.py` counts them).

`traced_mesh()` is the strategy's mesh while its programs (and the state's init) are traced: `fj.nn.attention` splits a kernel XLA cannot partition over it
(`shard_map`). It is fitjax's own record, not JAX's mesh context (`jax.set_mesh`,
`jax.sharding.use_abstract_mesh`): under that, Flax applies every parameter's annotation as a
sharding constraint, which fails where the annotation names an axis the mesh lacks (a model
annotated for `fsdp` trained with "dp" or "single").
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from typing import Any, Callable, Iterator

import jax

__all__ = ["traced_for", "traced_mesh", "traced_platform", "tracing_for"]

_PLATFORM: contextvars.ContextVar[str | None] = contextvars.ContextVar("fitjax_traced_platform", default=None)
_MESH: contextvars.ContextVar[Any] = contextvars.ContextVar("fitjax_traced_mesh", default=None)


@contextlib.contextmanager
def tracing_for(platform: str | None, mesh: Any = None) -> Iterator[None]:
    """Inside: `traced_platform()` is `platform` ("cpu", "gpu", "tpu"; None: unchanged) and
    `traced_mesh()` is `mesh` (None: unchanged)."""
    tokens = [(var, var.set(value)) for var, value in ((_PLATFORM, platform), (_MESH, mesh)) if value is not None]
    try:
        yield
    finally:
        for var, token in reversed(tokens):
            var.reset(token)


def traced_platform() -> str:
    """The platform of the program being traced: its strategy's, else JAX's default backend."""
    return _PLATFORM.get() or jax.default_backend()


def traced_mesh() -> Any:
    """The `jax.sharding.Mesh` of the strategy whose program is being traced (None outside one)."""
    return _MESH.get()


def traced_for(fn: Callable, platform: str | None, mesh: Any = None) -> Callable:
    """`fn` traced under `tracing_for(platform, mesh)` (its name kept: compile logs show it)."""
    @functools.wraps(fn)
    def traced(*args, **kwargs):
        with tracing_for(platform, mesh):
            return fn(*args, **kwargs)

    return traced
