"""What Adam's moments take per device in each storage `fj.optim.adamw(moments=...)` offers, read
from a train state's optimizer state (abstract or real): what a plan reports beside the optimizer
column, and how the out-of-memory search prices a change of the moments' precision without
compiling it.

The planner compiles the optimizer the module returns, so a plan of `fj.optim.adamw(moments=
"int8")` already holds its int8 state; this is the other direction: from the state of an `optax`
or `fj.optim` Adam, what the same moments would take stored otherwise. Per value: float32 8 bytes
(two moments), bfloat16 4, int8 2 plus two float32 absmax scales per block of 256 (a leaf too
small to quantize keeps float32 moments: `fitjax.optim`'s `min_8bit_size` rule), each read from
`fj.optim.scale_by_adam`'s own state made abstractly.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import optax

from fitjax.optim import ScaleByAdamBlockwiseState, scale_by_adam
from fitjax.strategies import bytes_per_device

__all__ = ["STORAGES", "adam_moments"]

#: the storages `fj.optim.adamw(moments=...)` offers, widest first
STORAGES = ("float32", "bfloat16", "int8")


def _is_adam(x: Any) -> bool:
    return isinstance(x, (optax.ScaleByAdamState, ScaleByAdamBlockwiseState))


def _storage(state: Any) -> str:
    if isinstance(state, ScaleByAdamBlockwiseState):
        return "int8"
    dtypes = {leaf.dtype for leaf in jax.tree.leaves((state.mu, state.nu))}
    return "bfloat16" if dtypes == {jnp.dtype("bfloat16")} else "float32"


@functools.lru_cache(maxsize=1024)  # a model's layers repeat a few shapes
def _bytes(shape: tuple[int, ...], storage: str) -> int:
    """Bytes of both moments of one `shape` leaf stored as `storage`: `fj.optim.scale_by_adam`'s own
    state, made abstractly (its small-leaf and block rules are the optimizer's, not copied here)."""
    state = jax.eval_shape(scale_by_adam(moments=storage).init, jax.ShapeDtypeStruct(shape, jnp.float32))
    held = (state.mu, state.nu) if storage != "int8" else (state.mu, state.nu, state.mu_absmax, state.nu_absmax)
    return sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(held))


def adam_moments(opt_state: Any) -> dict[str, Any] | None:
    """Adam's moments in `opt_state`, per device: `{"storage": how they are stored now, "bytes":
    what they take now, "float32": ..., "bfloat16": ..., "int8": what they would take stored
    so}`; None when the state holds no Adam (`optax.scale_by_adam`'s or `fj.optim`'s).

    A sharded leaf counts its share of the device holding the most of it (as
    `fitjax.strategies.bytes_per_device`).

    Example:
        >>> import jax.numpy as jnp, optax
        >>> state = optax.adam(1e-3).init({"w": jnp.zeros((64, 256))})
        >>> moments = adam_moments(state)
        >>> moments["storage"], moments["bytes"], moments["bfloat16"], moments["int8"]
        ('float32', 131072, 65536, 33280)
    """
    found = [x for x in jax.tree.leaves(opt_state, is_leaf=_is_adam) if _is_adam(x)]
    if not found:
        return None
    storages = {_storage(state) for state in found}
    out: dict[str, Any] = {"storage": storages.pop() if len(storages) == 1 else "mixed", "bytes": 0,
                           **{storage: 0 for storage in STORAGES}}
    for state in found:
        held = (state.mu, state.nu) if isinstance(state, optax.ScaleByAdamState) else \
            (state.mu, state.nu, state.mu_absmax, state.nu_absmax)
        out["bytes"] += bytes_per_device(held)
        for leaf in jax.tree.leaves(state.mu):
            shape = tuple(leaf.shape)
            whole = math.prod(shape) * leaf.dtype.itemsize
            share = bytes_per_device(leaf) / whole if whole else 1.0  # this device's part of the leaf
            for storage in STORAGES:
                out[storage] += int(_bytes(shape, storage) * share)
    return out
