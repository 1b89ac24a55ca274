"""Binned ranking metrics: `AUROC` and `AveragePrecision`, on google-metrax's threshold counts.

Both keep, for each class and each of `thresholds` evenly spaced thresholds `t` in [0, 1], the
counts of positives and negatives scored above `t` (metrax's `AUCROC` / `AUCPR` state, as Keras's
`AUC(num_thresholds=...)`): 4 x classes x thresholds float32 numbers, merged by a sum, so an
epoch's, 8 devices' or 2 processes' curve is exact for that binning. The update compares every
score with every threshold: O(batch x classes x thresholds) work (200 thresholds, 10 classes, a
batch of 64: 128k comparisons, next to nothing beside a model's step).

Exact vs binned: torchmetrics' default (`thresholds=None`) sorts every score of the epoch, which
needs all of them in memory; binned, only pairs (positive, negative) whose scores fall between
the same two neighbouring thresholds are uncertain, so `|binned - exact|` is at most the fraction
of such pairs (typically below 1e-3 with 200 thresholds and spread-out scores). torchmetrics'
own binned mode (`thresholds=200`) gives the same numbers to float32 precision, except for scores
lying exactly on a threshold (metrax counts `score > t`, torchmetrics `score >= t`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from fitjax.metrics._base import Metric, State
from fitjax.metrics._classification import check_task, safe_divide

__all__ = ["AUROC", "AveragePrecision"]

_AVERAGES = ("macro", "weighted", "none", "micro")
_DEFAULT_THRESHOLDS = 200


class _Binned(Metric):
    """Per class (column) counts above each threshold, from metrax's binary state."""

    _fields = ("true_positives", "false_positives", "true_negatives", "false_negatives")

    def __init__(self, task: str, thresholds: int | None = None, num_classes: int | None = None,
                 num_labels: int | None = None, average: str | None = "macro", max_fpr: float | None = None,
                 ignore_index: int | None = None, validate_args: bool = True, **kwargs: Any) -> None:
        super().__init__()
        owner = type(self).__name__
        average = "none" if average is None else average
        self.columns = check_task(owner, task, num_classes, num_labels, averages=_AVERAGES, average=average)
        thresholds = _DEFAULT_THRESHOLDS if thresholds is None else thresholds
        if not isinstance(thresholds, int) or thresholds < 2:
            raise ValueError(
                f"{owner}(thresholds=...) must be an int >= 2 (the number of evenly spaced thresholds; "
                f"fitjax's {owner} is always binned, default {_DEFAULT_THRESHOLDS}), got {thresholds!r}."
            )
        if max_fpr is not None:
            raise ValueError(f"{owner}(max_fpr={max_fpr!r}): the partial AUROC is not supported; leave it None.")
        self.task, self.thresholds, self.average, self.ignore_index = task, thresholds, average, ignore_index

    def empty(self) -> State:
        zeros = jnp.zeros((self.columns, self.thresholds), jnp.float32)
        return {name: zeros for name in self._fields}

    def batch_state(self, preds: jax.Array, target: jax.Array) -> State:
        import metrax

        preds, target = jnp.asarray(preds, jnp.float32), jnp.asarray(target)
        if self.task == "multiclass":  # one-vs-rest columns
            scores = jnp.moveaxis(preds, 1, -1).reshape(-1, self.columns)
            inside = jnp.all((scores >= 0) & (scores <= 1))
            scores = jnp.where(inside, scores, jax.nn.softmax(scores, -1))
            target = target.reshape(-1)
            valid = target != self.ignore_index if self.ignore_index is not None else jnp.ones(target.shape, bool)
            labels = jax.nn.one_hot(jnp.where(valid, target, 0), self.columns, dtype=jnp.int32)
            valid = jnp.broadcast_to(valid[:, None], scores.shape)
        else:
            if self.task == "binary":
                scores, labels = preds.reshape(-1, 1), target.reshape(-1, 1)
            else:
                scores = jnp.moveaxis(preds, 1, -1).reshape(-1, self.columns)
                labels = jnp.moveaxis(target, 1, -1).reshape(-1, self.columns)
            inside = jnp.all((scores >= 0) & (scores <= 1))
            scores = jnp.where(inside, scores, jax.nn.sigmoid(scores))
            valid = labels != self.ignore_index if self.ignore_index is not None else jnp.ones(labels.shape, bool)
            labels = jnp.where(valid, labels, 0)

        def column(s, y, w):  # metrax's binary counts of one class
            m = metrax.AUCROC.from_model_output(s, y, sample_weights=w.astype(jnp.float32),
                                                num_thresholds=self.thresholds)
            return tuple(getattr(m, f) for f in self._fields)

        counts = jax.vmap(column, in_axes=1)(scores, labels, valid)
        return dict(zip(self._fields, counts))

    def compute_state(self, state: State) -> jax.Array:
        per_class = jax.vmap(self._binary)(*(jnp.asarray(state[f]) for f in self._fields))
        if self.task == "binary":
            return per_class[0]
        if self.average == "micro":  # the columns' counts summed: one curve
            return self._binary(*(jnp.asarray(state[f]).sum(0) for f in self._fields))
        if self.average == "none":
            return per_class
        if self.average == "weighted":  # by support: positives of each class
            support = jnp.asarray(state["true_positives"])[:, 0] + jnp.asarray(state["false_negatives"])[:, 0]
            return safe_divide((per_class * support).sum(), support.sum())
        return per_class.mean()

    def _binary(self, tp, fp, tn, fn) -> jax.Array:
        raise NotImplementedError


class AUROC(_Binned):
    """torchmetrics' `AUROC`, binned: the area under the ROC curve through `thresholds` points
    (metrax's `AUCROC`, one-vs-rest per class for multiclass; `average` "macro" (mean over
    classes), "weighted" (by support), "none" (one per class)). See the module's note for the
    bound against the exact area and the cost; a class with no positives scores 0, never NaN.

    Example:
        >>> import jax.numpy as jnp
        >>> from fitjax.metrics import AUROC
        >>> auroc = AUROC(task="binary")
        >>> float(auroc.update(jnp.array([.1, .4, .35, .8]), jnp.array([0, 0, 1, 1])).compute())
        0.75
    """

    def _binary(self, tp, fp, tn, fn):
        import metrax

        return metrax.AUCROC(true_positives=tp, true_negatives=tn, false_positives=fp, false_negatives=fn,
                             num_thresholds=self.thresholds).compute()


class AveragePrecision(_Binned):
    """torchmetrics' `AveragePrecision`, binned: `sum_t (R_t - R_t+1) P_t` over the `thresholds`
    points of the precision-recall curve (torchmetrics' step-wise sum, not metrax's interpolated
    `AUCPR`), from the same counts as `AUROC`.

    Example:
        >>> import jax.numpy as jnp
        >>> from fitjax.metrics import AveragePrecision
        >>> ap = AveragePrecision(task="binary")
        >>> round(float(ap.update(jnp.array([.1, .4, .35, .8]), jnp.array([0, 0, 1, 1])).compute()), 4)
        0.8333
    """

    def _binary(self, tp, fp, tn, fn):
        precision = jnp.append(safe_divide(tp, tp + fp), 1.0)
        recall = jnp.append(safe_divide(tp, tp + fn), 0.0)
        return -jnp.sum((recall[1:] - recall[:-1]) * precision[:-1])
