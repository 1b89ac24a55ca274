"""`DataParallel`: the batch split over a `data` mesh axis, the state replicated on every device
(with `zero1=True`, the optimizer state sharded over it instead: ZeRO stage 1)."""

from __future__ import annotations

from typing import Mapping, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from fitjax._typing import PyTree
from fitjax.strategies import _rules
from fitjax.strategies._base import Strategy

__all__ = ["DataParallel"]


class DataParallel(Strategy):
    """Data parallelism on a `jax.sharding` mesh (not pmap): XLA inserts the gradient all-reduce.

    Each device holds a full copy of params and optimizer state and `batch_size / n_devices` rows
    of each batch; the numbers are the same as on one device with the same global batch.

    Args:
        zero1: ZeRO stage 1: the optimizer state is sharded over the `data` axis (each array on
            its largest dimension the device count divides; arrays under `min_size_to_shard`
            elements, scalars and vectors stay whole), the parameters stay replicated. Each
            device then updates its slice of the optimizer state and XLA all-gathers the
            updated parameters: Adam's two moments take `1/n` of their memory per device for
            one all-gather of the parameters per step. The same numbers as without it (the
            update is elementwise). `Trainer(strategy="zero1")` is `DataParallel(zero1=True)`.
        min_size_to_shard: with `zero1`, smaller optimizer-state arrays stay replicated.

    Example:
        >>> import fitjax as fj
        >>> trainer = fj.Trainer(strategy="dp")          # every local device
        >>> trainer = fj.Trainer(strategy="dp", devices=4)
        >>> trainer = fj.Trainer(strategy=fj.strategies.DataParallel(zero1=True))
    """

    def __init__(self, zero1: bool = False, *, min_size_to_shard: int = 2**14):
        super().__init__()
        if not isinstance(zero1, bool):
            raise ValueError(f"DataParallel(zero1=...) must be True or False, got {zero1!r}")
        if isinstance(min_size_to_shard, bool) or not isinstance(min_size_to_shard, int) or min_size_to_shard < 0:
            raise ValueError(f"DataParallel(min_size_to_shard=...) must be a non-negative int (elements), "
                             f"got {min_size_to_shard!r}")
        self.zero1 = zero1
        self.min_size_to_shard = min_size_to_shard

    def _build_mesh(self, devices: Sequence[jax.Device]) -> Mesh:
        return Mesh(np.asarray(devices), ("data",))

    def state_shardings(self, abstract_state: PyTree, annotations: Mapping | None = None) -> PyTree:
        replicated = super().state_shardings(abstract_state, annotations)
        if not self.zero1:
            return replicated
        size = self.mesh.shape["data"]

        def sharded(leaf):
            spec = _rules.default_spec(tuple(leaf.shape), axis="data", axis_size=size,
                                       min_size=self.min_size_to_shard)
            return NamedSharding(self.mesh, spec)

        return replicated.replace(opt_state=jax.tree.map(sharded, abstract_state.opt_state))

    def __repr__(self) -> str:
        return super().__repr__()[:-1] + (", zero1=True)" if self.zero1 else ")")
