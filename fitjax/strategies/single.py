"""`SingleDevice`: everything on one device (a mesh of one)."""

from __future__ import annotations

from typing import Sequence

import jax
import numpy as np
from jax.sharding import Mesh

from fitjax.strategies._base import Strategy

__all__ = ["SingleDevice"]


class SingleDevice(Strategy):
    """Trains on one device: the first of the selected devices.

    Example:
        >>> import fitjax as fj
        >>> trainer = fj.Trainer(strategy=fj.strategies.SingleDevice())
    """

    def _build_mesh(self, devices: Sequence[jax.Device]) -> Mesh:
        return Mesh(np.asarray(devices[:1]), ("data",))
