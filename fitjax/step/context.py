"""What a traced step tells the user's code while it runs: the batch index and the eval stage.

The step sets these around its call of `module.loss`; the Lightning adapter (`fitjax._lightning`)
reads them to pass `batch_idx` and to pick `validation_step` or `test_step`. They are context
variables, set only while tracing, so nothing leaks between steps or threads.

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

__all__ = ["GroupLosses", "batch_index", "current_batch_index", "current_stage", "setting", "stage"]

_STAGE: contextvars.ContextVar[str] = contextvars.ContextVar("fitjax_eval_stage", default="val")
_BATCH_IDX: contextvars.ContextVar[Any] = contextvars.ContextVar("fitjax_batch_idx", default=None)


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


@dataclasses.dataclass(frozen=True)
class GroupLosses:
    """`{param group: loss}` returned under manual optimization (a pytree)."""

    losses: dict[str, jax.Array]


jax.tree_util.register_dataclass(GroupLosses, data_fields=["losses"], meta_fields=[])
