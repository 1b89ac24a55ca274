"""The metric protocol: a small pytree of state, `update`, `merge` and `compute`.

A metric object made in `__init__` (`self.val_f1 = F1Score(...)`) is a *declaration*: it holds
the metric's arguments and no state. `update(preds, target)` returns a new object of the same
class holding the state of that batch (merged into the object's own state, if it has one); the
state is a dict of a few arrays (counts, sums, histograms) whose `merge` is an elementwise sum
(or max/min), so states of batches, devices and processes combine in any order. `compute()`
turns a state into the number(s) logged.

Inside a step the trainer traces, every `update` of a declaration is also recorded (by the
declaration's identity) in the open recording block, so Lightning's
`self.val_f1.update(preds, y)` followed by `self.log("val_f1", self.val_f1)` logs the state of
that update: the Python object never holds state, the step stays pure, and the state lives in the
train state's accumulators (`fitjax.metrics.Tracked`), merged there and computed on the host when
logged.

A user's own metric subclasses `Metric` and defines `empty`, `batch_state` and `compute_state`
(and `merge_ops` for fields merged by max or min). Any other object with `merge(other)` and
`compute()` that is a pytree (a `clu.metrics.Metric` or a `metrax` metric) works as it is, if it is
made from arrays: metrax's text metrics (`BLEU`, `RougeL`, `RougeN`, `WER`) take Python strings
and run on the host, outside the step.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Iterator, Mapping

import jax
import jax.numpy as jnp

__all__ = ["Metric", "is_metric", "recording", "recorded"]

State = dict[str, jax.Array]

_MERGE_OPS = ("sum", "max", "min")

# the open recording block: {id(declaration): (declaration, metric holding the step's merged updates)}
_UPDATES: contextvars.ContextVar[dict | None] = contextvars.ContextVar("fitjax_metric_updates", default=None)


@contextlib.contextmanager
def recording(into: dict) -> Iterator[dict]:
    """Records the updates of metric declarations made inside the block into `into`."""
    token = _UPDATES.set(into)
    try:
        yield into
    finally:
        _UPDATES.reset(token)


def recorded(metric: Any) -> Any:
    """`metric` itself when it holds a state; for a declaration, the state its updates in the
    open recording block gave. Raises when a declaration was not updated."""
    if not isinstance(metric, Metric) or metric.state is not None:
        return metric
    updates = _UPDATES.get()
    found = None if updates is None else updates.get(id(metric), (None, None))[1]
    if found is None:
        raise ValueError(
            f"{metric!r} holds no state: it is a declaration, and it was not updated in this step. "
            f"Update it before logging it (`self.metric(preds, target)` or `.update(preds, target)`), "
            f"or log what `update` returns."
        )
    return found


def is_metric(value: Any) -> bool:
    """Whether `value` is a stateful metric (fitjax's, clu's or metrax's): `merge` and `compute`."""
    return callable(getattr(value, "merge", None)) and callable(getattr(value, "compute", None)) \
        and not isinstance(value, jax.Array)


class Metric:
    """Abstract base of fitjax's metrics; subclass it for a metric of your own.

    A subclass sets its arguments as attributes in `__init__` (after `super().__init__()`;
    plain hashable values: they are the pytree's static part) and defines:

    - `empty() -> dict[str, Array]`: the state before any update (zeros of fixed shapes);
    - `batch_state(*args, **kwargs) -> dict[str, Array]`: one batch's state (traced);
    - `compute_state(state) -> Array`: the value (a scalar, or a vector / matrix of them);
    - `merge_ops`: `{field: "max" | "min"}` for fields not merged by a sum.

    Example:
        >>> import jax.numpy as jnp
        >>> from fitjax.metrics import Metric
        >>> class CountAbove(Metric):
        ...     '''The fraction of values above `threshold`.'''
        ...     def __init__(self, threshold: float = 0.0):
        ...         super().__init__()
        ...         self.threshold = threshold
        ...     def empty(self):
        ...         return {"above": jnp.zeros((), jnp.int32), "total": jnp.zeros((), jnp.int32)}
        ...     def batch_state(self, values):
        ...         return {"above": (values > self.threshold).sum(dtype=jnp.int32),
        ...                 "total": jnp.asarray(values.size, jnp.int32)}
        ...     def compute_state(self, state):
        ...         return state["above"] / jnp.maximum(state["total"], 1)
        >>> m = CountAbove(0.5).update(jnp.array([0.1, 0.7, 0.9]))
        >>> float(m.merge(CountAbove(0.5).update(jnp.array([0.2]))).compute())
        0.5
    """

    merge_ops: Mapping[str, str] = {}

    def __init__(self) -> None:
        self._state: State | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        jax.tree_util.register_pytree_node(cls, _flatten, lambda aux, leaves: _unflatten(cls, aux, leaves))

    # ---------------------------------------------------------------- what a subclass defines

    def empty(self) -> State:
        """The state before any update."""
        raise NotImplementedError

    def batch_state(self, *args: Any, **kwargs: Any) -> State:
        """One batch's state (traced inside the step)."""
        raise NotImplementedError

    def compute_state(self, state: State) -> jax.Array:
        """The value of a state."""
        raise NotImplementedError

    # ----------------------------------------------------------------------------- the protocol

    @property
    def state(self) -> State | None:
        """The state this object holds; None for a declaration."""
        return self._state

    def update(self, *args: Any, **kwargs: Any) -> "Metric":
        """A new metric holding this one's state merged with the batch's (torchmetrics' `update`,
        but functional: this object is left as it is). Inside a traced step the update of a
        declaration is also recorded, for `self.log(name, declaration)`."""
        batch = self._with(self.batch_state(*args, **kwargs))
        new = batch if self._state is None else self.merge(batch)
        updates = _UPDATES.get()
        if updates is not None and self._state is None:
            # keyed by identity, holding the declaration so that its id is not reused in the block
            key = id(self)
            updates[key] = (self, batch if key not in updates else updates[key][1].merge(batch))
        return new

    def __call__(self, *args: Any, **kwargs: Any) -> "Metric":
        """`update` (torchmetrics' `forward`): returns the batch's metric; `.compute()` gives its value."""
        return self.update(*args, **kwargs)

    def merge(self, other: "Metric") -> "Metric":
        """The state of both (an elementwise sum, or max / min for the fields of `merge_ops`)."""
        if self._state is None or other.state is None:
            return self if other.state is None else other
        merged = {}
        for key, value in self._state.items():
            op = self.merge_ops.get(key, "sum")
            merged[key] = {"sum": jnp.add, "max": jnp.maximum, "min": jnp.minimum}[op](value, other.state[key])
        return self._with(merged)

    def reduce_rows(self, keep: jax.Array) -> "Metric":
        """The merge of states stacked on a leading axis (one per example), rows with `keep`
        False left out: how an evaluation step (which traces each example on its own) merges
        its batch, without merging row by row."""
        out = {}
        for key, value in self._state.items():
            op = self.merge_ops.get(key, "sum")
            mask = keep.reshape(keep.shape + (1,) * (value.ndim - 1))
            if op == "sum":
                out[key] = jnp.where(mask, value, jnp.zeros_like(value)).sum(0).astype(value.dtype)
            else:
                far = _far(value.dtype, op)
                picked = jnp.where(mask, value, far)
                out[key] = picked.max(0) if op == "max" else picked.min(0)
        return self._with(out)

    def compute(self) -> jax.Array:
        """The value of the state held (of `empty()` for a declaration)."""
        return self.compute_state(self._state if self._state is not None else self.empty())

    def reset(self) -> "Metric":
        """Nothing to reset: the object holds no state (the trainer resets the accumulated state
        at each epoch and log window). Kept so that Lightning's `metric.reset()` runs."""
        return self

    def empty_metric(self) -> "Metric":
        """This metric holding `empty()`."""
        return self._with(self.empty())

    # --------------------------------------------------------------------------------- inside

    def _with(self, state: State) -> "Metric":
        new = object.__new__(type(self))
        new.__dict__.update({k: v for k, v in self.__dict__.items() if k != "_state"})
        new._state = dict(state)
        return new

    def _arguments(self) -> tuple:
        return tuple(sorted((k, v) for k, v in self.__dict__.items() if k != "_state"))

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self._arguments())
        return f"{type(self).__name__}({args})"


def _far(dtype, op: str):
    if jnp.issubdtype(dtype, jnp.floating):
        return -jnp.inf if op == "max" else jnp.inf
    info = jnp.iinfo(dtype)
    return info.min if op == "max" else info.max


def _flatten(metric: Metric):
    state = metric.state
    keys = None if state is None else tuple(sorted(state))
    leaves = () if state is None else tuple(state[k] for k in keys)
    return leaves, (metric._arguments(), keys)


def _unflatten(cls, aux, leaves) -> Metric:
    arguments, keys = aux
    new = object.__new__(cls)
    new.__dict__.update(dict(arguments))
    new._state = None if keys is None else dict(zip(keys, leaves))
    return new
