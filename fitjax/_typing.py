"""Type aliases shared across fitjax, in one place."""

from __future__ import annotations

from typing import Any, Mapping

import jax

PyTree = Any
Batch = Any  # a pytree of arrays whose leaves share the leading (example) dimension
Metrics = Mapping[str, jax.Array]
HostMetrics = dict[str, float]

__all__ = ["Batch", "HostMetrics", "Metrics", "PyTree"]
