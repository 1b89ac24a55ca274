"""`DataParallel`: the batch split over a `data` mesh axis, the state replicated on every device."""

from __future__ import annotations

from typing import Sequence

import jax
import numpy as np
from jax.sharding import Mesh

from fitjax.strategies._base import Strategy

__all__ = ["DataParallel"]


class DataParallel(Strategy):
    """Data parallelism on a `jax.sharding` mesh (not pmap): XLA inserts the gradient all-reduce.

    Each device holds a full copy of params and optimizer state and `batch_size / n_devices` rows
    of each batch; the numbers are the same as on one device with the same global batch.

    Example:
        >>> import fitjax as fj
        >>> trainer = fj.Trainer(strategy="dp")          # every local device
        >>> trainer = fj.Trainer(strategy="dp", devices=4)
    """

    def _build_mesh(self, devices: Sequence[jax.Device]) -> Mesh:
        return Mesh(np.asarray(devices), ("data",))
