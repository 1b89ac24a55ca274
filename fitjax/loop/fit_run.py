"""What lives for one `Trainer.fit` and dies with it (`FitRun`), and what fit, validate, test
or predict built for a module and leave behind for the next call (`Built`).

The loop is the only writer of both: `trainer.py` (through `FitRun.build` for the state and
programs), `_epoch` for the train state it steps and `_resume` for a restored one; the other
parts of `fitjax.loop` take what they need as arguments and return values.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import jax
import numpy as np

from fitjax import runs as runs_lib
from fitjax import step as step_lib
from fitjax._typing import Batch
from fitjax.loop._checks import BuiltFrom
from fitjax.loop._pieces import PieceRunner
from fitjax.loop.train_feed import BatchPositions, FitLoaders, TrainFeed
from fitjax.module import LitModule
from fitjax.runs import Runs
from fitjax.state import TrainState
from fitjax.strategies import StopAgreement, Strategy, in_device_memory

__all__ = ["Built", "FitRun", "step_flops", "trained_variables"]


@dataclasses.dataclass(frozen=True)
class Built:
    """The programs built for `module` and the variables they run on: a fit's train state at its
    end, or None when an evaluation stage built them (the module holds its weights). What
    validate, test and predict after fit, `save_checkpoint` and host calls of the model reuse."""

    module: LitModule
    compiled: step_lib.Compiled
    built_from: BuiltFrom
    state: TrainState | None = None
    positions: BatchPositions | None = None  # a fit's train loader positions (a save after it)


@dataclasses.dataclass(eq=False)
class FitRun:
    """One fit's state: the module and its loaders, the train state and compiled programs, the
    device feed, the validation schedule's counters, the stop agreement and what a stop saved.

    Attributes:
        module: the module being fitted.
        loaders: fit's loaders (and the hooks that reload them).
        feed: the train data as the loop consumes it.
        stopping: the processes' agreement on a stop step (SIGTERM, the requeue signal).
        state: the train state (None until built).
        compiled: the compiled programs of the current accumulation count.
        built_from: the batch the programs were built from (errors name a batch shaped otherwise).
        pieces: the step pieces' epoch and end-of-training work.
        val_every: validate every this many batches (None: at epoch ends).
        last_val_time: when the last validation ended (`time.monotonic`; a time-based
            `val_check_interval` counts from it).
        resume_at: the batch the first (resumed) epoch starts at.
        requeue_from: the hpc checkpoint the requeue signal saved: the job is requeued once
            fit is done.
    """

    module: LitModule
    loaders: FitLoaders
    feed: TrainFeed
    stopping: StopAgreement
    state: TrainState | None = None
    compiled: step_lib.Compiled | None = None
    built_from: BuiltFrom | None = None
    pieces: PieceRunner | None = None
    val_every: int | None = None
    last_val_time: float = 0.0
    resume_at: int = 0
    requeue_from: Path | None = None
    #: the first train batch's shapes and dtypes, for the planner when the step runs out of memory
    batch_spec: Any = None

    def build(self, first: Batch, *, strategy: Strategy, seed: int, runs: Runs | None) -> None:
        """The train state and compiled programs, from the first train batch (with `runs`: every
        run's state stacked, one program training them all)."""
        self.batch_spec = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), getattr(x, "dtype", None)
                                                                      or np.asarray(x).dtype), first)
        if runs is None:
            self.state, self.compiled = step_lib.build(self.module.step_spec(), strategy, first, seed=seed,
                                                       options=self.feed.options)
        else:
            self.state, self.compiled = runs.build(self.module, strategy, first, options=self.feed.options,
                                                   per_run_data=isinstance(self.feed.loader, runs_lib.RunOrders))
        self.built_from = BuiltFrom.of(first, "the first train batch")

    def built(self) -> Built | None:
        """What this fit leaves behind for the calls after it (None: it built nothing)."""
        if self.compiled is None:
            return None
        return Built(self.module, self.compiled, self.built_from, self.state, self.feed.positions)


def trained_variables(state: TrainState, pieces, *, runs: bool) -> tuple:
    """`(params, model_state)` a fit hands back to its module: the parameters its state pieces
    leave for it (`pieces.module_params`) and, with several runs, the first run's; in device
    memory, where `Trainer(offload="optimizer+master")` kept them on the host (a user's own
    `jax.jit` of the model mixes no memory kinds)."""
    params = in_device_memory(step_lib.pieces.module_params(state, pieces))
    model_state = state.model_state
    if runs:  # the module holds one run's weights: the first's
        params, model_state = runs_lib.member((params, model_state), 0)
    return params, model_state


def step_flops(compiled: step_lib.Compiled, remat: str) -> float | None:
    """XLA's FLOPs of one optimizer step of `compiled`'s train step on each device, compiled with
    `remat` (one more compilation when it is not the step's own); None when none are reported."""
    options = compiled.options
    cost = compiled.train_step_cost if remat == options.remat else compiled.train_programs_for(
        dataclasses.replace(options, remat=remat))["train_step_cost"]
    flops = cost().get("flops")
    return None if flops is None or flops <= 0 else flops / options.steps_per_execution
