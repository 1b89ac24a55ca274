"""The largest batch whose compiled train step fits a memory budget, from XLA's memory analysis."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import numpy as np

from fitjax import step as step_lib
from fitjax.planner import device_memory_limit
from fitjax.step.jitted import step_memory_bytes

__all__ = ["BatchSizeProbe", "device_memory_limit", "search", "step_memory_bytes"]


class BatchSizeProbe:
    """Compiles the trainer's train step for one batch size at a time and measures it.

    The state is built once (initialised from an example batch of the smallest size the strategy
    takes); each candidate is lowered with abstract inputs of its size, never run.
    """

    def __init__(self, module, strategy, options: step_lib.StepOptions, batch: Any, *, seed: int):
        self.options = options
        self.shards = strategy.num_batch_shards
        self.example = jax.tree.map(lambda x: np.asarray(x)[:1], batch)
        small = jax.tree.map(lambda x: np.repeat(x, self.shards, axis=0), self.example)
        state, self.compiled = step_lib.build(module.step_spec(), strategy, small, seed=seed, options=options)
        self.abstract_state = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)
        del state
        self.measured: dict[int, int] = {}

    def inputs(self, batch_size: int) -> Any:
        """Abstract inputs of one full train-step call with batches of `batch_size`."""
        k, spe = self.options.accumulate_grad_batches, self.options.steps_per_execution
        lead = ((spe,) if spe > 1 else ()) + ((k,) if k > 1 else ())
        batch = jax.tree.map(lambda x: jax.ShapeDtypeStruct((*lead, batch_size, *x.shape[1:]), x.dtype),
                             self.example)
        return (batch, jax.ShapeDtypeStruct(lead, np.bool_)) if k > 1 else batch

    def __call__(self, batch_size: int) -> int:
        """Peak bytes per device of the train step compiled for `batch_size` (cached)."""
        if batch_size not in self.measured:
            lowered = self.compiled.train_step.lower(self.abstract_state, self.inputs(batch_size))
            self.measured[batch_size] = step_memory_bytes(lowered.compile().memory_analysis())
        return self.measured[batch_size]


def search(fits: Callable[[int], bool], *, mode: str, init_val: int, step: int, max_trials: int) -> int:
    """Lightning's search over batch sizes (multiples of `step`): "power" doubles while `fits`;
    "binsearch" then bisects between the last size that fit and the first that did not."""
    size = max(step, -(-init_val // step) * step)
    if not fits(size):
        raise ValueError(f"scale_batch_size: even the first candidate, batch size {size}, does not fit; "
                         "lower init_val or raise max_memory_bytes.")
    low, high, trials = size, None, 1
    while trials < max_trials:
        trials += 1
        if fits(low * 2):
            low *= 2
        else:
            high = low * 2
            break
    if mode == "power" or high is None:
        return low
    while trials < max_trials and high - low > step:
        trials += 1
        mid = (low + high) // 2 // step * step
        if fits(mid):
            low = mid
        else:
            high = mid
    return low


def replace_spe(options: step_lib.StepOptions, spe: int) -> step_lib.StepOptions:
    return dataclasses.replace(options, steps_per_execution=spe)
