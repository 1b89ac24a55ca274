"""Model state recomputed from the data: BatchNorm statistics as the plain average over batches.

torch's `update_bn` (what Lightning's SWA runs after the weights are averaged) resets each
BatchNorm's running statistics and sets `momentum=None`, so one pass over the train data leaves
the cumulative average of the per-batch statistics. flax's BatchNorm has no such switch: its
running update is always `new = m * old + (1 - m) * batch_stat` for a momentum `m` the trainer
cannot see. That update is affine in `old`, so two train-mode forward passes recover both parts
for every floating leaf of the model state, Linen's `batch_stats` and NNX's `BatchStat` alike,
with no knowledge of the layers: at `old = 0` the new value is `c = (1 - m) * batch_stat`; at
`old = K`, a power of two well above `|c|` (so `m * K` is exact and `c` does not blur it), it is
`m * K + c`, which gives `m`, hence `batch_stat = c / (1 - m)`. (A derivative would give `m` in
one pass, but NNX's BatchNorm stops gradients through its update.) Leaves the train step leaves
unchanged (`m == 1`: not a running statistic) keep their value.

The result is the average of flax's own batch statistics: the biased variance that flax stores
(torch stores the unbiased one), rounded by one division by `1 - m` (float32; see
docs/porting.md).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from fitjax._typing import Batch, PyTree
from fitjax.step.forward import forward
from fitjax.step.module_spec import ModuleSpec

__all__ = ["make_running_average"]


def _floating(x) -> bool:
    return jnp.issubdtype(jnp.asarray(x).dtype, jnp.floating)


def make_running_average(spec: ModuleSpec, policy) -> Callable:
    """`step(params, model_state, average, n, rng, batch) -> average`: the running average over
    batches of the statistics the train-mode forward pass of `batch` would fold into the model
    state (`average` after `n` batches; with `n == 0` it is ignored). Leaves that are no running
    statistic come back as in `model_state`."""

    def statistics(params, model_state, rng, batch):
        leaves, treedef = jax.tree.flatten(model_state)
        floats = [i for i, x in enumerate(leaves) if _floating(x)]

        def new_floats(values):
            full = list(leaves)
            for i, v in zip(floats, values):
                full[i] = v
            new_state = forward(spec, "loss", params, jax.tree.unflatten(treedef, full), rng, batch,
                                train=True, policy=policy).model_state
            new_leaves = jax.tree.leaves(new_state)
            return [new_leaves[i].astype(jnp.float32) for i in floats]

        scaled = new_floats([jnp.zeros(leaves[i].shape, jnp.float32) for i in floats])
        big = [jnp.exp2(jnp.ceil(jnp.log2(jnp.abs(c) + 1.0)) + 8.0) for c in scaled]
        momenta = [(n - c) / k for n, c, k in zip(new_floats(big), scaled, big)]
        return leaves, treedef, floats, scaled, momenta

    def step(params: PyTree, model_state: PyTree, average: PyTree, n: jax.Array, rng: jax.Array,
             batch: Batch) -> PyTree:
        leaves, treedef, floats, scaled, momenta = statistics(params, model_state, rng, batch)
        avg_leaves = jax.tree.leaves(average)
        out = list(leaves)
        for i, c, m in zip(floats, scaled, momenta):
            running = (m >= 0) & (m < 1)
            stat = c / jnp.where(running, 1.0 - m, 1.0)
            prev = avg_leaves[i].astype(jnp.float32)
            new = jnp.where(n == 0, stat, prev + (stat - prev) / (n + 1).astype(jnp.float32))
            out[i] = jnp.where(running, new, leaves[i].astype(jnp.float32)).astype(leaves[i].dtype)
        return jax.tree.unflatten(treedef, out)

    return step
