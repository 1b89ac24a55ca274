"""Regression, text and aggregation metrics: `MeanSquaredError`, `MeanAbsoluteError`,
`R2Score`, `Perplexity`, `MeanMetric`, `SumMetric`, `MaxMetric`, `MinMetric`.

Their states are a few float32 sums (a max or min for `MaxMetric` / `MinMetric`), so the value of
an epoch is computed from the sums of all its examples, over every device and process.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from fitjax.metrics._base import Metric, State
from fitjax.metrics._classification import safe_divide

__all__ = ["MaxMetric", "MeanAbsoluteError", "MeanMetric", "MeanSquaredError", "MinMetric", "Perplexity",
           "R2Score", "SumMetric"]


def _f32(x) -> jax.Array:
    return jnp.asarray(x, jnp.float32)


class MeanSquaredError(Metric):
    """torchmetrics' `MeanSquaredError` (`squared=False`: its root), over every element seen;
    `num_outputs > 1`: one per output column.

    Example:
        >>> import jax.numpy as jnp
        >>> from fitjax.metrics import MeanSquaredError
        >>> float(MeanSquaredError().update(jnp.array([1., 2.]), jnp.array([1., 4.])).compute())
        2.0
    """

    def __init__(self, squared: bool = True, num_outputs: int = 1, **kwargs: Any) -> None:
        super().__init__()
        self.squared, self.num_outputs = bool(squared), int(num_outputs)

    def empty(self) -> State:
        shape = () if self.num_outputs == 1 else (self.num_outputs,)
        return {"total": jnp.zeros(shape, jnp.float32), "count": jnp.zeros(shape, jnp.float32)}

    def _errors(self, preds, target):
        return (_f32(preds) - _f32(target)) ** 2

    def batch_state(self, preds: jax.Array, target: jax.Array) -> State:
        errors = self._errors(preds, target)
        if self.num_outputs > 1:
            errors = errors.reshape(-1, self.num_outputs)
            return {"total": errors.sum(0), "count": jnp.full((self.num_outputs,), errors.shape[0], jnp.float32)}
        return {"total": errors.sum(), "count": jnp.asarray(errors.size, jnp.float32)}

    def compute_state(self, state: State) -> jax.Array:
        mean = safe_divide(state["total"], state["count"])
        return mean if self.squared else jnp.sqrt(mean)


class MeanAbsoluteError(MeanSquaredError):
    """torchmetrics' `MeanAbsoluteError`: the mean of `|preds - target|` over every element seen."""

    def __init__(self, num_outputs: int = 1, **kwargs: Any) -> None:
        super().__init__(squared=True, num_outputs=num_outputs)

    def _errors(self, preds, target):
        return jnp.abs(_f32(preds) - _f32(target))


class R2Score(Metric):
    """torchmetrics' `R2Score`: `1 - SS_res / SS_tot` per output column (`[N]` or `[N, outputs]`
    inputs) from four sums, `multioutput` "uniform_average" (mean over outputs), "raw_values" or
    "variance_weighted"; `adjusted=k`: adjusted for k regressors.

    Example:
        >>> import jax.numpy as jnp
        >>> from fitjax.metrics import R2Score
        >>> float(R2Score().update(jnp.array([2.5, 0.0, 2.0, 8.0]), jnp.array([3.0, -0.5, 2.0, 7.0])).compute())
        0.948...
    """

    def __init__(self, adjusted: int = 0, multioutput: str = "uniform_average", **kwargs: Any) -> None:
        super().__init__()
        if multioutput not in ("uniform_average", "raw_values", "variance_weighted"):
            raise ValueError("R2Score(multioutput=...) must be 'uniform_average', 'raw_values' or "
                             f"'variance_weighted', got {multioutput!r}.")
        self.adjusted, self.multioutput = int(adjusted), multioutput

    def empty(self) -> State:
        zero = jnp.zeros((), jnp.float32)
        return {"sum_y": zero, "sum_y2": zero, "rss": zero, "count": zero}

    def batch_state(self, preds: jax.Array, target: jax.Array) -> State:
        preds, target = _f32(preds), _f32(target)  # the state is shaped like one row: [] or [outputs]
        return {"sum_y": target.sum(0), "sum_y2": (target ** 2).sum(0), "rss": ((target - preds) ** 2).sum(0),
                "count": jnp.asarray(target.shape[0], jnp.float32)}

    def compute_state(self, state: State) -> jax.Array:
        n = _f32(state["count"])
        mean = safe_divide(state["sum_y"], n)
        tss = _f32(state["sum_y2"]) - n * mean ** 2
        raw = 1.0 - safe_divide(state["rss"], tss)
        if self.multioutput == "raw_values" or raw.ndim == 0:
            r2 = raw
        elif self.multioutput == "variance_weighted":
            r2 = safe_divide((tss * raw).sum(), tss.sum())
        else:
            r2 = raw.mean()
        if self.adjusted:
            r2 = 1.0 - (1.0 - r2) * (n - 1) / (n - self.adjusted - 1)
        return r2


class Perplexity(Metric):
    """torchmetrics' `Perplexity`: `exp(mean negative log-likelihood)` of the targets under
    `preds` (logits `[batch, seq, vocab]`), `ignore_index` targets left out.

    Example:
        >>> import jax.numpy as jnp
        >>> from fitjax.metrics import Perplexity
        >>> logits = jnp.log(jnp.array([[[0.5, 0.5], [0.25, 0.75]]]))
        >>> round(float(Perplexity().update(logits, jnp.array([[0, 1]])).compute()), 4)
        1.633
    """

    def __init__(self, ignore_index: int | None = None, **kwargs: Any) -> None:
        super().__init__()
        self.ignore_index = ignore_index

    def empty(self) -> State:
        return {"total": jnp.zeros((), jnp.float32), "count": jnp.zeros((), jnp.float32)}

    def batch_state(self, preds: jax.Array, target: jax.Array) -> State:
        logp = jax.nn.log_softmax(_f32(preds), -1)
        target = jnp.asarray(target)
        valid = target != self.ignore_index if self.ignore_index is not None else jnp.ones(target.shape, bool)
        picked = jnp.take_along_axis(logp, jnp.where(valid, target, 0)[..., None], -1)[..., 0]
        return {"total": -jnp.where(valid, picked, 0.0).sum(), "count": valid.sum(dtype=jnp.float32)}

    def compute_state(self, state: State) -> jax.Array:
        return jnp.exp(safe_divide(state["total"], state["count"]))


class _Aggregate(Metric):
    def __init__(self, nan_strategy: str | float = "warn", **kwargs: Any) -> None:
        super().__init__()
        if nan_strategy not in ("warn", "error", "ignore", "disable") and not isinstance(nan_strategy, (int, float)):
            raise ValueError(f"{type(self).__name__}(nan_strategy=...) must be 'warn', 'error', 'ignore', "
                             f"'disable' or a number, got {nan_strategy!r}.")
        self.nan_strategy = nan_strategy

    def _clean(self, value: jax.Array, weight: jax.Array | None = None):
        """torchmetrics' NaN rule, traced: NaNs dropped ("warn", "ignore"; fitjax cannot warn
        from inside a step) or replaced by the number given; "error"/"disable" keep them."""
        value = _f32(value)
        weight = jnp.ones_like(value) if weight is None else jnp.broadcast_to(_f32(weight), value.shape)
        if isinstance(self.nan_strategy, (int, float)):
            return jnp.where(jnp.isnan(value), float(self.nan_strategy), value), weight
        if self.nan_strategy in ("warn", "ignore"):
            keep = ~jnp.isnan(value)
            return jnp.where(keep, value, 0.0), jnp.where(keep, weight, 0.0)
        return value, weight


class MeanMetric(_Aggregate):
    """torchmetrics' `MeanMetric`: the weighted mean of every value given (`update(value, weight=1.0)`).

    Example:
        >>> import jax.numpy as jnp
        >>> from fitjax.metrics import MeanMetric
        >>> float(MeanMetric().update(jnp.array([1., 2., 6.])).compute())
        3.0
    """

    def empty(self) -> State:
        return {"total": jnp.zeros((), jnp.float32), "weight": jnp.zeros((), jnp.float32)}

    def batch_state(self, value: jax.Array, weight: jax.Array | float = 1.0) -> State:
        value, weight = self._clean(value, weight)
        return {"total": (value * weight).sum(), "weight": weight.sum()}

    def compute_state(self, state: State) -> jax.Array:
        return safe_divide(state["total"], state["weight"])


class SumMetric(_Aggregate):
    """torchmetrics' `SumMetric`: the sum of every value given."""

    def empty(self) -> State:
        return {"total": jnp.zeros((), jnp.float32)}

    def batch_state(self, value: jax.Array) -> State:
        value, weight = self._clean(value)
        return {"total": (value * weight).sum()}

    def compute_state(self, state: State) -> jax.Array:
        return jnp.asarray(state["total"])


class MaxMetric(_Aggregate):
    """torchmetrics' `MaxMetric`: the largest value given (-inf before any)."""

    merge_ops = {"value": "max"}

    def empty(self) -> State:
        return {"value": jnp.full((), -jnp.inf, jnp.float32)}

    def batch_state(self, value: jax.Array) -> State:
        value, weight = self._clean(value)
        return {"value": jnp.where(weight > 0, value, -jnp.inf).max()}

    def compute_state(self, state: State) -> jax.Array:
        return jnp.asarray(state["value"])


class MinMetric(_Aggregate):
    """torchmetrics' `MinMetric`: the smallest value given (inf before any)."""

    merge_ops = {"value": "min"}

    def empty(self) -> State:
        return {"value": jnp.full((), jnp.inf, jnp.float32)}

    def batch_state(self, value: jax.Array) -> State:
        value, weight = self._clean(value)
        return {"value": jnp.where(weight > 0, value, jnp.inf).min()}

    def compute_state(self, state: State) -> jax.Array:
        return jnp.asarray(state["value"])
