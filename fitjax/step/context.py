"""What a traced step tells the user's code while it runs: the batch index, the eval stage and
the index of the evaluation's loader.

The step sets these around its call of `module.loss`; the Lightning adapter (`fitjax.module._lightning`)
reads them to pass `batch_idx` and to pick `validation_step` or `test_step`. They are context
variables, set only while tracing, so nothing leaks between steps or threads.

`run_hparams` is what `self.hparams` reads while one member of a fit of several runs is traced
(`Trainer(runs=...)`): the values that differ between the runs, as traced arrays.

`GroupLosses` is what `module.loss` returns as its outputs under manual optimization: one loss
per parameter group, each group updated by the gradient of its own loss.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from typing import Any, Iterator

import jax
import jax.numpy as jnp

__all__ = ["GroupLosses", "LoaderIndex", "batch_index", "current_batch_index", "current_dataloader_index",
           "current_run_hparams", "current_stage", "dataloader_index", "run_hparams", "RunHparams", "setting",
           "stage"]

_STAGE: contextvars.ContextVar[str] = contextvars.ContextVar("fitjax_eval_stage", default="val")
_BATCH_IDX: contextvars.ContextVar[Any] = contextvars.ContextVar("fitjax_batch_idx", default=None)


@dataclasses.dataclass
class LoaderIndex:
    """Which evaluation loader a traced step serves (a Python int: the step is traced once per
    loader that needs its own), and whether the user's code read it while tracing."""

    value: int = 0
    read: bool = False


_LOADER_IDX: contextvars.ContextVar[LoaderIndex | None] = contextvars.ContextVar("fitjax_loader_idx", default=None)


@contextlib.contextmanager
def setting(var: contextvars.ContextVar, value: Any) -> Iterator[None]:
    """`var` set to `value` inside the block, restored after it."""
    token = var.set(value)
    try:
        yield
    finally:
        var.reset(token)


def stage(name: str) -> contextlib.AbstractContextManager[None]:
    """Which evaluation a traced eval step belongs to: "val" or "test"."""
    return setting(_STAGE, name)


def current_stage() -> str:
    return _STAGE.get()


def batch_index(value: Any) -> contextlib.AbstractContextManager[None]:
    """The batch index the user's code sees while the step is traced (a traced int)."""
    return setting(_BATCH_IDX, value)


def current_batch_index() -> jax.Array:
    value = _BATCH_IDX.get()
    # Created inside the trace, so it is a tracer too: Python control flow on it fails the same
    # way in every hook instead of silently taking one branch.
    return jnp.zeros((), jnp.int32) if value is None else jnp.asarray(value, jnp.int32)


def dataloader_index(index: LoaderIndex | int) -> contextlib.AbstractContextManager[None]:
    """The loader index the user's code sees while the step is traced (`validation_step`'s
    `dataloader_idx`, `LitModule.dataloader_idx`); a `LoaderIndex` records whether it was read."""
    return setting(_LOADER_IDX, index if isinstance(index, LoaderIndex) else LoaderIndex(index))


def current_dataloader_index() -> int:
    """The loader index (0 outside an evaluation of several loaders); marks it read."""
    index = _LOADER_IDX.get()
    if index is None:
        return 0
    index.read = True
    return index.value


@dataclasses.dataclass(frozen=True)
class RunHparams:
    """The hyperparameters of the run being traced (`Trainer(runs=[{...}, ...])`): `values`
    replace the module's saved ones (a value that differs between runs is a traced array), and
    `read` collects the names the user's code read (a name never read would be a silent no-op)."""

    values: dict[str, Any]
    read: set = dataclasses.field(default_factory=set)


_RUN_HPARAMS: contextvars.ContextVar[RunHparams | None] = contextvars.ContextVar("fitjax_run_hparams", default=None)


def run_hparams(values: RunHparams) -> contextlib.AbstractContextManager[None]:
    """`self.hparams` reads `values` over the module's own inside the block (while tracing)."""
    return setting(_RUN_HPARAMS, values)


def current_run_hparams() -> RunHparams | None:
    """The run's hyperparameters being traced, or None (one run, or outside a trace)."""
    return _RUN_HPARAMS.get()


@dataclasses.dataclass(frozen=True)
class GroupLosses:
    """`{param group: loss}` returned under manual optimization (a pytree)."""

    losses: dict[str, jax.Array]


jax.tree_util.register_dataclass(GroupLosses, data_fields=["losses"], meta_fields=[])
