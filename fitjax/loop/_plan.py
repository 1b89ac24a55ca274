"""`Trainer.plan` and `fj.plan`: the trainer's train step planned for a target before training."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import jax
import numpy as np

from fitjax import planner
from fitjax.loop.train_feed import fit_loaders
from fitjax.strategies import Strategy, resolve as resolve_strategy

__all__ = ["check_no_runs", "choose_for_fit", "first_train_batch", "plan_trainer"]


def first_train_batch(module, train_data, datamodule) -> Any:
    """The first batch fit would train on (host arrays), from the same sources fit reads; a
    batch given as `jax.ShapeDtypeStruct`s is that batch (a plan needs its shapes alone)."""
    leaves = jax.tree.leaves(train_data)
    if datamodule is None and leaves and all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves):
        return train_data
    loaders = fit_loaders(module, train_data, None, datamodule, overfit=False)
    batch = next(iter(loaders.train), None)
    if batch is None:
        raise ValueError("Trainer.plan: the train data is empty: it yielded no batch.")
    return jax.tree.map(np.asarray, batch)


def check_no_runs(runs, where: str) -> None:
    """The planner compiles one run's step: a `Trainer(runs=N)` step vmaps N states and batches
    through it (N times the state, other activations), which no plan describes yet: refused."""
    if runs is not None:
        raise ValueError(
            f"{where} with Trainer(runs={runs.size}) is not supported: the planner plans one run's train step, "
            f"and {runs.size} runs side by side hold {runs.size} states in one program. Pick the strategy "
            "yourself (runs take strategy='single', 'dp' or 'runs'), or plan one run with a Trainer without runs=.")


def plan_trainer(trainer, module, train_data, datamodule, *, target: str | None, sweep: bool | Mapping[str, Sequence],
                 memory_bytes: int | None, headroom: float, strategy: str | Strategy | None = None) -> planner.Plan:
    """`Trainer.plan`. `strategy` (None: the trainer's) is resolved for the target's devices: "auto"
    is "dp" over a slice's chips, and a mesh the trainer's own devices cannot hold (`FSDP(tensor=2)`
    on a one-device laptop) is built over the target's."""
    if memory_bytes is not None and (isinstance(memory_bytes, bool) or not isinstance(memory_bytes, int)
                                     or memory_bytes <= 0):
        raise ValueError(f"Trainer.plan(memory_bytes=...) must be a positive int (bytes per device) or None, "
                         f"got {memory_bytes!r}.")
    check_no_runs(trainer.runs, "Trainer.plan")
    if strategy is not None and planner.planned_strategy(strategy) is not None:
        raise ValueError(f"Trainer.plan(strategy={strategy!r}): a plan is what strategy='plan' asks for; plan "
                         "the strategies with sweep=True, or name one ('fsdp', fitjax.strategies.FSDP(...)).")
    resolved = planner.resolve_target(target, trainer.devices, memory_bytes=memory_bytes)
    if strategy is not None:  # set up over the target's devices by the planner, never over this machine's
        strategy = resolve_strategy(strategy, num_devices=len(resolved.devices))
    batch = first_train_batch(module, train_data, datamodule)
    return planner.plan(module, batch, resolved, strategy=strategy or trainer.strategy, options=trainer.step_options,
                        sweep=sweep, headroom=headroom)


def choose_for_fit(spec: planner.PlannedStrategy, module, train_data, datamodule, devices, options) -> planner.Choice:
    """`Trainer(strategy="plan")`: the planner's strategy and options for this fit's first batch."""
    return planner.choose(spec, module, first_train_batch(module, train_data, datamodule), devices, options)
