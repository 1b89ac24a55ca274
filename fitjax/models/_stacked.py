"""`scan_layers`' stacked arrays against a checkpoint's per-layer ones, both ways: a source whose
`model.layers.<i>.<rest>` arrays read as one `model.layers.<rest>` [layers, ...] (import), and
the variables of a scanned model unstacked into the unrolled model's `layers_<i>` (export).
"""

from __future__ import annotations

import re
from typing import Any

import jax
import numpy as np

from fitjax.models._config import ModelConfig
from fitjax.module import WeightSource

__all__ = ["StackedLayers", "unstacked"]

# `model.layers.3.mlp.up_proj.weight`, `transformer.h.3.attn.c_attn.weight`, a base model's `h.3.ln_1.bias`
_LAYER = re.compile(r"((?:.*\.)?(?:h|layers))\.(\d+)\.(.+)")


class StackedLayers(WeightSource):
    """`source` with each name's `layers` per-layer arrays (`model.layers.<i>.<rest>`, i from 0 to
    layers - 1, all of one shape and dtype) seen as one array `model.layers.<rest>` [layers, ...];
    other arrays as they are. Each device's part is read from the layers it holds."""

    def __init__(self, source: WeightSource, layers: int):
        self.source, self.description = source, source.description
        entries = source.entries()
        found: dict[str, dict[int, str]] = {}
        for name in entries:
            match = _LAYER.fullmatch(name)
            if match:
                found.setdefault(f"{match[1]}.{match[3]}", {})[int(match[2])] = name
        self._members: dict[str, list[str]] = {}
        for stacked, by_layer in found.items():
            names = [by_layer.get(i) for i in range(layers)]
            kinds = {(entries[n].shape, entries[n].dtype) for n in names if n is not None}
            if None not in names and len(by_layer) == layers and len(kinds) == 1:
                self._members[stacked] = names
        grouped = {n for names in self._members.values() for n in names}
        self._entries = {name: e for name, e in entries.items() if name not in grouped}
        for stacked, names in self._members.items():
            first = entries[names[0]]
            self._entries[stacked] = jax.ShapeDtypeStruct((layers, *first.shape), first.dtype)

    def entries(self) -> dict[str, jax.ShapeDtypeStruct]:
        return dict(self._entries)

    def read(self, name: str, index: tuple[slice, ...]) -> np.ndarray:
        if name not in self._members:
            return self.source.read(name, index)
        names = self._members[name]
        rest = tuple(index[1:])
        return np.stack([self.source.read(names[i], rest) for i in range(len(names))[index[0]]])


def unstacked(variables: tuple[Any, Any], config: ModelConfig) -> tuple[Any, Any]:
    """`(params, model_state)` of a `scan_layers` model in the unrolled model's layout: the
    stacked `layers` (GPT-2's `h`) as `layers_0` ... `layers_<n-1>`."""
    params, model_state = variables
    prefix = "h" if config.gpt2_layout else "layers"
    rest = {key: value for key, value in params.items() if key != prefix}
    for i in range(config.num_layers):
        rest[f"{prefix}_{i}"] = jax.tree.map(lambda a, i=i: a[i], params[prefix])
    return rest, model_state
