"""Classification metrics from per-class counts: `Accuracy`, `Precision`, `Recall`, `F1Score`,
`FBetaScore` and `ConfusionMatrix`, with torchmetrics' names, arguments and reductions.

The state of the first five is four int32 vectors, one count per class (`tp`, `fp`, `tn`, `fn`;
one entry for `task="binary"`): merged by a sum, so the state of an epoch, of 8 devices or of 2
processes is the sum of theirs, and the score computed from it is the epoch's score, not a mean
of per-batch scores. The update is a few comparisons and sums over the batch (O(batch x classes));
the state is 16 bytes a class.

Inputs follow torchmetrics: `binary`: `preds [N, ...]` probabilities (or logits: a sigmoid is
applied when a value lies outside [0, 1]) or 0/1 labels, `target [N, ...]` 0/1; `multiclass`:
`preds [N, C, ...]` scores (or `[N, ...]` class ids), `target [N, ...]` class ids;
`multilabel`: `preds [N, L, ...]`, `target [N, L, ...]` 0/1. `ignore_index` leaves out the
targets equal to it. One difference: torchmetrics decides "logits or probabilities" over each
`update`'s whole batch, and an evaluation step traces each example on its own, so pass
probabilities (`jax.nn.sigmoid(logits)`) for binary and multilabel tasks unless every logit
batch has a value outside [0, 1].
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from fitjax.metrics._base import Metric, State

__all__ = ["Accuracy", "ConfusionMatrix", "F1Score", "FBetaScore", "Precision", "Recall", "check_task"]

TASKS = ("binary", "multiclass", "multilabel")
AVERAGES = ("micro", "macro", "weighted", "none")


def check_task(owner: str, task: Any, num_classes: Any, num_labels: Any, *, averages=AVERAGES, average=None,
               top_k: Any = 1) -> int:
    """Checks torchmetrics' task arguments at construction; returns the number of columns."""
    if task not in TASKS:
        raise ValueError(f"{owner}(task=...) must be one of {TASKS}, got {task!r}.")
    if average is not None and average not in averages:
        raise ValueError(f"{owner}(average=...) must be one of {averages} (or None for 'none'), got {average!r}.")
    if task == "multiclass" and (not isinstance(num_classes, int) or num_classes < 2):
        raise ValueError(f"{owner}(task='multiclass') needs num_classes, an int >= 2; got {num_classes!r}.")
    if task == "multilabel" and (not isinstance(num_labels, int) or num_labels < 1):
        raise ValueError(f"{owner}(task='multilabel') needs num_labels, an int >= 1; got {num_labels!r}.")
    if not isinstance(top_k, int) or top_k < 1 or (task == "multiclass" and top_k > num_classes):
        raise ValueError(f"{owner}(top_k=...) must be an int from 1 to num_classes, got {top_k!r}.")
    if top_k != 1 and task != "multiclass":
        raise ValueError(f"{owner}(top_k={top_k!r}) applies to task='multiclass' only (got task={task!r}).")
    return {"binary": 1, "multiclass": num_classes, "multilabel": num_labels}[task]


def _probabilities(preds: jax.Array, how: str) -> jax.Array:
    """torchmetrics' rule: scores outside [0, 1] are logits and get a sigmoid (softmax)."""
    inside = jnp.all((preds >= 0) & (preds <= 1))
    squash = jax.nn.sigmoid(preds) if how == "sigmoid" else jax.nn.softmax(preds, axis=-1)
    return jnp.where(inside, preds, squash)


def _class_last(x: jax.Array, columns: int) -> jax.Array:
    """`[N, C, ...]` -> `[N * ..., C]`."""
    return jnp.moveaxis(x, 1, -1).reshape(-1, columns)


def one_hot_inputs(task: str, columns: int, preds, target, *, threshold: float, top_k: int, ignore_index):
    """`(predicted, actual, valid)`: bool `[rows, columns]` each, the rows of an ignored target
    (every column of it; for multilabel, that label) marked not valid."""
    preds, target = jnp.asarray(preds), jnp.asarray(target)
    if task == "multiclass":
        if preds.ndim == target.ndim + 1:
            scores = _class_last(preds, columns)
            choice = scores.argmax(-1)
            if top_k > 1:  # torchmetrics' rule: the target when it is among the k best, else the best
                best = jax.lax.top_k(scores, top_k)[1]
                choice = jnp.where((best == target.reshape(-1, 1)).any(-1), target.reshape(-1), best[:, 0])
            predicted = jax.nn.one_hot(choice, columns, dtype=bool)
        else:
            predicted = jax.nn.one_hot(preds.reshape(-1), columns, dtype=bool)
        target = target.reshape(-1)
        valid = (target != ignore_index) if ignore_index is not None else jnp.ones(target.shape, bool)
        actual = jax.nn.one_hot(jnp.where(valid, target, 0), columns, dtype=bool)
        return predicted, actual, jnp.broadcast_to(valid[:, None], predicted.shape)
    if task == "binary":
        preds, target = preds.reshape(-1, 1), target.reshape(-1, 1)
    else:
        preds, target = _class_last(preds, columns), _class_last(target, columns)
    if jnp.issubdtype(preds.dtype, jnp.floating):
        predicted = _probabilities(preds, "sigmoid") > threshold
    else:
        predicted = preds.astype(bool)
    valid = (target != ignore_index) if ignore_index is not None else jnp.ones(target.shape, bool)
    return predicted, (target == 1) & valid, valid


def safe_divide(num: jax.Array, den: jax.Array, zero_division: float = 0.0) -> jax.Array:
    """`num / den`, `zero_division` where `den` is 0 (never NaN: a class never predicted scores 0)."""
    num, den = jnp.asarray(num, jnp.float32), jnp.asarray(den, jnp.float32)
    return jnp.where(den == 0, jnp.float32(zero_division), num / jnp.where(den == 0, 1.0, den))


class _StatScores(Metric):
    """Per-class `tp, fp, tn, fn` counts; subclasses reduce them to a score."""

    # with top_k > 1, macro leaves out the classes without support (torchmetrics' rule for
    # accuracy, precision and recall; its F-beta keeps the top_k = 1 rule)
    _support_rule = True

    def __init__(self, task: str, threshold: float = 0.5, num_classes: int | None = None,
                 num_labels: int | None = None, average: str | None = "micro", multidim_average: str = "global",
                 top_k: int = 1, ignore_index: int | None = None, validate_args: bool = True,
                 zero_division: float = 0.0, **kwargs: Any) -> None:
        super().__init__()
        owner = type(self).__name__
        if multidim_average != "global":
            raise ValueError(f"{owner}(multidim_average=...) supports 'global' only, got {multidim_average!r}.")
        average = "none" if average is None else average
        self.columns = check_task(owner, task, num_classes, num_labels, average=average, top_k=top_k)
        self.task, self.threshold, self.average = task, float(threshold), average
        self.top_k, self.ignore_index, self.zero_division = int(top_k), ignore_index, float(zero_division)

    def empty(self) -> State:
        zeros = jnp.zeros((self.columns,), jnp.int32)
        return {"tp": zeros, "fp": zeros, "tn": zeros, "fn": zeros}

    def batch_state(self, preds: jax.Array, target: jax.Array) -> State:
        predicted, actual, valid = one_hot_inputs(self.task, self.columns, preds, target, threshold=self.threshold,
                                                  top_k=self.top_k, ignore_index=self.ignore_index)

        def count(x):
            return (x & valid).sum(0, dtype=jnp.int32)

        return {"tp": count(predicted & actual), "fp": count(predicted & ~actual),
                "tn": count(~predicted & ~actual), "fn": count(~predicted & actual)}

    def compute_state(self, state: State) -> jax.Array:
        tp, fp, tn, fn = (jnp.asarray(state[k]) for k in ("tp", "fp", "tn", "fn"))
        if self.task == "binary":
            return self._score(tp, fp, tn, fn)[0]
        if self.average == "micro":
            return self._score(tp.sum(), fp.sum(), tn.sum(), fn.sum())
        score = self._score(tp, fp, tn, fn)
        if self.average == "none":
            return score
        if self.average == "weighted":
            weights = (tp + fn).astype(jnp.float32)
        else:  # macro: a class absent from targets and predictions counts for nothing
            absent = (tp + fn == 0) if self.top_k > 1 and self._support_rule else (tp + fp + fn == 0)
            weights = jnp.where(absent & (self.task != "multilabel"), 0.0, 1.0)
        return safe_divide((weights * score).sum(), weights.sum())

    def _score(self, tp, fp, tn, fn) -> jax.Array:
        raise NotImplementedError


class Accuracy(_StatScores):
    """torchmetrics' `Accuracy`: correct / all (multiclass: per class `tp / (tp + fn)`, then
    reduced by `average`; `top_k`: right when the target is among the k best scores).

    Example:
        >>> import jax.numpy as jnp
        >>> from fitjax.metrics import Accuracy
        >>> acc = Accuracy(task="multiclass", num_classes=3)
        >>> float(acc.update(jnp.array([[.8, .1, .1], [.2, .7, .1]]), jnp.array([0, 2])).compute())
        0.5
    """

    def _score(self, tp, fp, tn, fn):
        if self.task == "multiclass":
            return safe_divide(tp, tp + fn)
        return safe_divide(tp + tn, tp + tn + fp + fn)


class Precision(_StatScores):
    """torchmetrics' `Precision`: `tp / (tp + fp)` (`zero_division` where nothing was predicted)."""

    def _score(self, tp, fp, tn, fn):
        return safe_divide(tp, tp + fp, self.zero_division)


class Recall(_StatScores):
    """torchmetrics' `Recall`: `tp / (tp + fn)`."""

    def _score(self, tp, fp, tn, fn):
        return safe_divide(tp, tp + fn, self.zero_division)


class FBetaScore(_StatScores):
    """torchmetrics' `FBetaScore`: `(1 + b²) tp / ((1 + b²) tp + b² fn + fp)`.

    Example:
        >>> import jax.numpy as jnp
        >>> from fitjax.metrics import FBetaScore
        >>> f2 = FBetaScore(task="binary", beta=2.0)
        >>> round(float(f2.update(jnp.array([.9, .8, .2]), jnp.array([1, 0, 1])).compute()), 4)
        0.5
    """

    def __init__(self, task: str, beta: float = 1.0, threshold: float = 0.5, num_classes: int | None = None,
                 num_labels: int | None = None, average: str | None = "micro", multidim_average: str = "global",
                 top_k: int = 1, ignore_index: int | None = None, validate_args: bool = True,
                 zero_division: float = 0.0, **kwargs: Any) -> None:
        super().__init__(task, threshold, num_classes, num_labels, average, multidim_average, top_k, ignore_index,
                         validate_args, zero_division)
        if not isinstance(beta, (int, float)) or beta <= 0:
            raise ValueError(f"{type(self).__name__}(beta=...) must be a number > 0, got {beta!r}.")
        self.beta = float(beta)

    _support_rule = False

    def _score(self, tp, fp, tn, fn):
        b2 = self.beta ** 2
        return safe_divide((1 + b2) * tp, (1 + b2) * tp + b2 * fn + fp, self.zero_division)


class F1Score(FBetaScore):
    """torchmetrics' `F1Score`: `2 tp / (2 tp + fn + fp)`, reduced over classes by `average`
    ("micro": from the summed counts; "macro": the mean over the classes seen; "weighted": by
    each class's support; "none": one score per class, logged as `name/0`, `name/1`, ...).

    Example:
        >>> import jax.numpy as jnp
        >>> from fitjax.metrics import F1Score
        >>> f1 = F1Score(task="multiclass", num_classes=3, average="macro")
        >>> state = f1.update(jnp.array([0, 1, 1, 2]), jnp.array([0, 1, 2, 2]))
        >>> round(float(state.compute()), 4)
        0.7778
    """

    def __init__(self, task: str, threshold: float = 0.5, num_classes: int | None = None,
                 num_labels: int | None = None, average: str | None = "micro", multidim_average: str = "global",
                 top_k: int = 1, ignore_index: int | None = None, validate_args: bool = True,
                 zero_division: float = 0.0, **kwargs: Any) -> None:
        super().__init__(task, 1.0, threshold, num_classes, num_labels, average, multidim_average, top_k,
                         ignore_index, validate_args, zero_division)


class ConfusionMatrix(Metric):
    """torchmetrics' `ConfusionMatrix`: int32 counts, rows the target and columns the
    prediction (`[C, C]`; `[2, 2]` binary; `[L, 2, 2]` multilabel), `normalize` "true", "pred"
    or "all" dividing by row, column or total sums. Logged as a picture in TensorBoard.

    Example:
        >>> import jax.numpy as jnp
        >>> from fitjax.metrics import ConfusionMatrix
        >>> cm = ConfusionMatrix(task="multiclass", num_classes=3)
        >>> cm.update(jnp.array([0, 1, 1]), jnp.array([0, 2, 1])).compute().tolist()
        [[1, 0, 0], [0, 1, 0], [0, 1, 0]]
    """

    def __init__(self, task: str, threshold: float = 0.5, num_classes: int | None = None,
                 num_labels: int | None = None, normalize: str | None = None, ignore_index: int | None = None,
                 validate_args: bool = True, **kwargs: Any) -> None:
        super().__init__()
        owner = type(self).__name__
        self.columns = check_task(owner, task, num_classes, num_labels)
        if normalize not in (None, "none", "true", "pred", "all"):
            raise ValueError(f"{owner}(normalize=...) must be None, 'true', 'pred' or 'all', got {normalize!r}.")
        self.task, self.threshold, self.ignore_index = task, float(threshold), ignore_index
        self.normalize = None if normalize == "none" else normalize

    def empty(self) -> State:
        shape = {"binary": (2, 2), "multiclass": (self.columns, self.columns),
                 "multilabel": (self.columns, 2, 2)}[self.task]
        return {"matrix": jnp.zeros(shape, jnp.int32)}

    def batch_state(self, preds: jax.Array, target: jax.Array) -> State:
        predicted, actual, valid = one_hot_inputs(self.task, self.columns, preds, target, threshold=self.threshold,
                                                  top_k=1, ignore_index=self.ignore_index)
        if self.task == "multiclass":
            rows = (actual & valid).astype(jnp.int32)
            return {"matrix": rows.T @ predicted.astype(jnp.int32)}
        # binary and multilabel: per column, [[tn, fp], [fn, tp]]
        p, a, v = predicted, actual, valid
        cells = [[~a & ~p, ~a & p], [a & ~p, a & p]]
        matrix = jnp.stack([jnp.stack([(c & v).sum(0, dtype=jnp.int32) for c in row], -1) for row in cells], -2)
        return {"matrix": matrix[0] if self.task == "binary" else matrix}

    def compute_state(self, state: State) -> jax.Array:
        matrix = jnp.asarray(state["matrix"])
        if self.normalize is None:
            return matrix
        axis = {"true": -1, "pred": -2, "all": (-2, -1)}[self.normalize]
        return safe_divide(matrix, matrix.sum(axis, keepdims=True))
