"""`RunsParallel`: the runs of a `Trainer(runs=...)` fit split over the devices, each device
training its share of them on the whole batch.

Every leaf of the weights, model state and optimizer state of a fit of several runs has a
leading runs axis (`fitjax.runs`): this strategy shards that axis over a `runs` mesh axis and
replicates the batch, so a device holds `runs / devices` runs and computes only theirs, with no
collective in the step (each run's gradient is its own). `strategy="dp"` does the opposite: every
device holds every run and a slice of the batch, and the gradients are all-reduced.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from fitjax._typing import PyTree
from fitjax.strategies._base import Strategy

__all__ = ["RunsParallel"]


class RunsParallel(Strategy):
    """The runs of a `Trainer(runs=...)` fit sharded over the devices, the batch whole on each.

    The number of runs must be a multiple of the number of devices. The numbers are each run's
    own, as on one device (each run's step is computed on one device, on the whole batch).

    Example:
        >>> import fitjax as fj
        >>> trainer = fj.Trainer(runs=8, strategy="runs")      # every local device
        >>> trainer = fj.Trainer(runs=8, strategy=fj.strategies.RunsParallel(), devices=4)
    """

    data_axes: tuple[str, ...] = ()  # the batch is not split: every device reads all of it

    def _build_mesh(self, devices: Sequence[jax.Device]) -> Mesh:
        return Mesh(np.asarray(devices), ("runs",))

    def state_shardings(self, abstract_state: PyTree, annotations: Mapping | None = None) -> PyTree:
        """The runs' axis (the first) of the weights, model state and optimizer state sharded; the
        step count, keys, metric accumulators and the runs' flags replicated (a few scalars each)."""
        replicated = super().state_shardings(abstract_state, annotations)
        size = self.mesh.shape["runs"]
        runs = jax.tree.leaves(abstract_state.rng)[0].shape[:1] if jax.tree.leaves(abstract_state.rng) else ()
        if not runs:
            raise ValueError(
                f"strategy=RunsParallel shards the runs of a Trainer(runs=...) fit over {size} devices, but "
                "this state holds one run (a fit without `runs=`, or a module of one run given to validate, "
                "test or predict): use strategy='dp' or 'single' for it.")
        if runs[0] % size:
            raise ValueError(
                f"strategy=RunsParallel shards the runs of a Trainer(runs=...) fit over {size} devices, but "
                f"it has {runs[0]}: use a number of runs that is a multiple of {size}, fewer devices "
                "(`Trainer(devices=...)`), or strategy='dp' (every run on every device, the batch split).")
        sharded = NamedSharding(self.mesh, P("runs"))

        def shard(tree):
            return jax.tree.map(lambda leaf: sharded if leaf.ndim else self.replicated, tree)

        return replicated.replace(params=shard(abstract_state.params), model_state=shard(abstract_state.model_state),
                                  opt_state=shard(abstract_state.opt_state))
