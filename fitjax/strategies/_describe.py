"""What each array of a state costs each device: its `PartitionSpec` and bytes per device.

Read from the arrays' own shardings (or a `ShapeDtypeStruct`'s), so it describes what is really
placed, whatever strategy or annotation placed it. A model summary prints these rows.
"""

from __future__ import annotations

import collections
from typing import Any, NamedTuple

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from fitjax._typing import PyTree
from fitjax.strategies._rules import path_names

__all__ = ["LeafSharding", "bytes_per_device", "describe_sharding", "peak_bytes"]


class LeafSharding(NamedTuple):
    """One array's layout: `spec` over the mesh, its global `shape`, bytes on each device."""

    spec: P
    shape: tuple[int, ...]
    dtype: Any
    bytes_per_device: int


def _itemsize(dtype) -> int:
    if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        return 8  # a threefry key: two uint32 words
    return np.dtype(dtype).itemsize


def _shard_bytes(leaf) -> tuple[int, set]:
    sharding = getattr(leaf, "sharding", None)
    shape = tuple(leaf.shape)
    itemsize = _itemsize(leaf.dtype)
    if sharding is None:
        return int(np.prod(shape)) * itemsize, set()
    return int(np.prod(sharding.shard_shape(shape))) * itemsize, set(sharding.device_set)


def describe_sharding(tree: PyTree) -> dict[str, LeafSharding]:
    """Per-leaf layout of a pytree of `jax.Array`s (or sharded `ShapeDtypeStruct`s).

    Keys are "/"-joined paths ("params/Dense_0/kernel", "opt_state/0/mu/Dense_0/kernel").

    Example:
        >>> import jax, jax.numpy as jnp
        >>> rows = describe_sharding({"w": jnp.zeros((4, 2))})
        >>> rows["w"].spec, rows["w"].bytes_per_device
        (P(), 32)
    """
    rows = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        sharding = getattr(leaf, "sharding", None)
        spec = sharding.spec if isinstance(sharding, NamedSharding) else P()
        nbytes, _ = _shard_bytes(leaf)
        rows["/".join(path_names(path))] = LeafSharding(spec, tuple(leaf.shape), leaf.dtype, nbytes)
    return rows


def bytes_per_device(tree: PyTree) -> int:
    """The most bytes any one device holds of `tree` (replicated arrays count on every device)."""
    per_device: dict = collections.Counter()
    unplaced = 0
    for leaf in jax.tree.leaves(tree):
        nbytes, devices = _shard_bytes(leaf)
        if not devices:
            unplaced += nbytes
        for device in devices:
            per_device[device] += nbytes
    return max(per_device.values(), default=0) + unplaced


def peak_bytes(stats: dict[str, int] | None) -> int | None:
    """A device's peak memory from its `memory_stats()`: the runtime's `peak_bytes_in_use`, plus
    `peak_bytes_reserved` where reported. A TPU's runtime reserves a program's temporaries apart
    from its arrays: GPT-2 small's fit on a v5e chip read 1.68 GiB in use and 5.83 GiB reserved,
    whose sum was its plan's peak within 0.8% (`benchmarks/results/tpu-v5e/plan-b5437c5.json`).
    None where the device reports no peak."""
    peak = (stats or {}).get("peak_bytes_in_use")
    return None if peak is None else peak + stats.get("peak_bytes_reserved", 0)
