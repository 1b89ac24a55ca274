"""A model's stack of scanned layers, offered to the step: how `Trainer(update_in_backward=True)`
runs the layers one at a time.

A model whose layers are one `nn.scan` over parameters stacked `[layers, ...]` calls
`run_layers(...)` where it would call the scan, giving the scan itself and one layer as a pure
function. Outside the step's in-backward pass (init, eval, predict, generation, the usual train
step) `run_layers` is the scan: nothing changes. Inside it (`fitjax.step.in_backward`), the same
call of the user's `loss` is traced twice around the layers: once `capturing` what enters the
stack (the layers' input and the context every layer gets), once with the stack's output
`replaced` by a value the step computed itself, layer by layer.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from typing import Any, Callable, Iterator

import jax

__all__ = ["Captured", "capturing", "replaced", "run_layers"]


@dataclasses.dataclass
class Captured:
    """What entered the layer stack during a `capturing` trace.

    Attributes:
        key: the top-level parameter key holding the stacked layers (`params[key]` `[layers, ...]`).
        layer: `layer(layer_params, x, context, index) -> x`, one layer as a pure function
            (`layer_params` one slice of `params[key]`, `index` its place as an int32 scalar).
        num_layers: the stack's depth.
        x: the layers' input (traced in the capturing trace).
        context: what every layer gets besides `x` (positions, masks: not differentiated).
    """

    key: str
    layer: Callable[[Any, jax.Array, Any, jax.Array], jax.Array]
    num_layers: int
    x: jax.Array | None = None
    context: Any = None


# None: the scan runs; a list: `capturing` (the stack's calls appended); an array: `replaced`
_mode: contextvars.ContextVar[Any] = contextvars.ContextVar("fitjax_layer_stack", default=None)


def run_layers(key: str, x: jax.Array, context: Any, *, layer: Callable, num_layers: int,
               scan: Callable[[jax.Array], jax.Array]) -> jax.Array:
    """`scan(x)`, the model's stack of layers on `x`, unless the step runs the layers itself.

    Args:
        key: the top-level parameter key of the stacked layers (`"layers"`, GPT-2's `"h"`).
        x: the stack's input.
        context: what every layer gets besides `x` (a pytree of arrays: positions, masks).
        layer: one layer, `layer(layer_params, x, context, index) -> x`, on the unboxed
            parameters of one slice of `params[key]`.
        num_layers: the stack's depth.
        scan: the stack as the model runs it, `scan(x) -> x`.
    """
    mode = _mode.get()
    if mode is None:
        return scan(x)
    if isinstance(mode, list):
        mode.append(Captured(key, layer, num_layers, x, context))
        return x  # what follows is traced and dropped: only the capture is used
    if mode.shape != x.shape:
        raise ValueError(f"update_in_backward: the layer stack {key!r} was called on {x.shape}, "
                         f"but its output given has shape {mode.shape}.")
    return mode.astype(x.dtype)


@contextlib.contextmanager
def capturing() -> Iterator[list[Captured]]:
    """Within: `run_layers` records its call (appended to the yielded list) and returns its input."""
    found: list[Captured] = []
    token = _mode.set(found)
    try:
        yield found
    finally:
        _mode.reset(token)


@contextlib.contextmanager
def replaced(y: jax.Array) -> Iterator[None]:
    """Within: `run_layers` returns `y` (the stack's output the step computed) instead of running."""
    token = _mode.set(y)
    try:
        yield
    finally:
        _mode.reset(token)
