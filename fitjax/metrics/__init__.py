"""Metrics: torchmetrics' classes whose state lives in the train state, and the mean accumulators.

`from fitjax.metrics import F1Score` is `from torchmetrics import F1Score` with the same
arguments. A metric object made in `__init__` is a declaration; its state (counts, sums,
histograms) is a small pytree the jitted step updates and merges over the batches of an epoch
(or a train log window), over the devices and over the processes, and the host computes the
value only when it is logged. See docs/guides/metrics.md.

Example:
    >>> import jax.numpy as jnp
    >>> from fitjax.metrics import F1Score
    >>> f1 = F1Score(task="multiclass", num_classes=3, average="macro")
    >>> a = f1.update(jnp.array([0, 1, 1]), jnp.array([0, 1, 2]))
    >>> b = f1.update(jnp.array([2]), jnp.array([2]))
    >>> round(float(a.merge(b).compute()), 4)
    0.7778
"""

from fitjax.metrics._accumulate import (
    Saved,
    Tracked,
    add,
    compute,
    compute_values,
    empty_like,
    examples_seen,
    from_plain,
    has_weight,
    merge_host,
    template_of,
    to_plain,
    zeros,
)
from fitjax.metrics._base import Metric, is_metric, recorded, recording
from fitjax.metrics._classification import Accuracy, ConfusionMatrix, F1Score, FBetaScore, Precision, Recall
from fitjax.metrics._collection import MetricCollection
from fitjax.metrics._ranking import AUROC, AveragePrecision
from fitjax.metrics._regression import (
    MaxMetric,
    MeanAbsoluteError,
    MeanMetric,
    MeanSquaredError,
    MinMetric,
    Perplexity,
    R2Score,
    SumMetric,
)

# what users write: the classes (the accumulator functions above are fitjax's own, not listed)
__all__ = [
    "AUROC",
    "Accuracy",
    "AveragePrecision",
    "ConfusionMatrix",
    "F1Score",
    "FBetaScore",
    "MaxMetric",
    "MeanAbsoluteError",
    "MeanMetric",
    "MeanSquaredError",
    "Metric",
    "MetricCollection",
    "MinMetric",
    "Perplexity",
    "Precision",
    "R2Score",
    "Recall",
    "SumMetric",
]
