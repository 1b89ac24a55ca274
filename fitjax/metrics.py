"""On-device metric accumulators: a weighted sum and a weight per name, read on the host rarely.

An accumulator is `{name: float32[2]}` holding `(sum of value * weight, sum of weight)`, where the
weight is the number of examples a value stands for. Updating one is a couple of adds inside the
jitted step; reading one (`compute`) is the only host sync, done at log time for every name in one
transfer.
"""

from __future__ import annotations

from typing import Iterable, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from fitjax._typing import HostMetrics

__all__ = ["add", "compute", "merge_host", "zeros"]

Accumulator = dict[str, jax.Array]


def zeros(names: Iterable[str]) -> Accumulator:
    """An empty accumulator for `names`."""
    return {name: jnp.zeros((2,), jnp.float32) for name in names}


def add(acc: Accumulator, values: Mapping[str, jax.Array], weight: jax.Array | float) -> Accumulator:
    """Adds `values` (scalars, or one value per example when `weight` is a vector)."""
    weight = jnp.asarray(weight, jnp.float32)
    out = {}
    for name, total in acc.items():
        value = jnp.asarray(values[name], jnp.float32)
        if weight.ndim:  # per-example values with a mask: padding rows weigh 0
            out[name] = total + jnp.stack([jnp.sum(value * weight), jnp.sum(weight)])
        else:
            out[name] = total + jnp.stack([value * weight, weight])
    return out


def merge_host(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Sums two host accumulators (e.g. an epoch total and the window just fetched)."""
    return {k: np.asarray(a.get(k, 0.0), np.float64) + np.asarray(b.get(k, 0.0), np.float64) for k in {*a, *b}}


def compute(acc: Mapping[str, np.ndarray]) -> HostMetrics:
    """Weighted means of a host accumulator; names with no weight yet are left out."""
    return {name: float(total / weight) for name, (total, weight) in acc.items() if weight > 0}
