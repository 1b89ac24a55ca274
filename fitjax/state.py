"""`TrainState`: everything a step reads and writes, as one pytree."""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax

from fitjax._typing import PyTree

__all__ = ["TrainState"]


@flax.struct.dataclass
class TrainState:
    """One pytree holding the whole mutable state of training.

    Attributes:
        step: optimizer steps taken (int32 scalar); folded into `rng` so each step draws fresh keys.
        params: the trainable parameters (a nested dict of arrays).
        model_state: non-trainable model variables (BatchNorm statistics, NNX rng counters).
        opt_state: the optax state.
        rng: the run's base key; per-step keys are `fold_in(rng, step)`, so a resumed run continues
            the same random stream.
        metrics: train-metric accumulators since the last log (see `fitjax.metrics`).
        loss_scale: the dynamic loss scale with `precision="16-mixed"` (a `fitjax.precision.LossScale`),
            else None.
        extras: the state of the pieces callbacks add around the step (`fitjax.step.pieces`),
            `{piece name: pytree}`, e.g. an EMA of the parameters; None when there are none.
    """

    step: jax.Array
    params: PyTree
    model_state: PyTree
    opt_state: PyTree
    rng: jax.Array
    metrics: dict[str, jax.Array]
    loss_scale: PyTree = None
    extras: PyTree = None

    def with_fields(self, **fields: Any) -> "TrainState":
        """`replace(**fields)` made without `dataclasses.replace`'s call of `__init__` over every
        field (~0.4 µs on CPU against ~3): the loop swaps the metric accumulators at most log
        steps and the train step's call its random key at every call (`fitjax.step.jitted`).
        A `TrainState` has no `__post_init__` to run."""
        if not fields.keys() <= _FIELDS:
            raise TypeError(f"TrainState.with_fields: {sorted(fields.keys() - _FIELDS)!r} are not fields of a "
                            f"TrainState; its fields are {sorted(_FIELDS)!r}.")
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        new.__dict__.update(fields)
        return new


_FIELDS = frozenset(field.name for field in dataclasses.fields(TrainState))
