"""`MetricCollection`: several metrics updated with the same inputs, logged under one prefix."""

from __future__ import annotations

import copy
from typing import Any, Iterator, Mapping, Sequence

from fitjax.metrics._base import is_metric

__all__ = ["MetricCollection"]


class MetricCollection(Mapping):
    """torchmetrics' `MetricCollection`: a mapping `prefix + name + postfix -> metric`.

    `update(preds, target)` (or calling it) updates every metric and returns a collection of
    the updated ones, so `self.log_dict(self.val_metrics(preds, y))` and, after
    `self.val_metrics.update(preds, y)`, `self.log_dict(self.val_metrics)` both log each metric;
    in `metrics(batch, outputs)`, `return {**collection.update(preds, labels)}`.

    Example:
        >>> import jax.numpy as jnp
        >>> from fitjax.metrics import Accuracy, F1Score, MetricCollection
        >>> val = MetricCollection({"acc": Accuracy(task="binary"), "f1": F1Score(task="binary")}, prefix="val_")
        >>> {k: float(v) for k, v in val.update(jnp.array([.9, .2]), jnp.array([1, 1])).compute().items()}
        {'val_acc': 0.5, 'val_f1': 0.6666666865348816}
    """

    def __init__(self, metrics: Mapping[str, Any] | Sequence[Any] | Any, *additional: Any,
                 prefix: str | None = None, postfix: str | None = None, **kwargs: Any) -> None:
        if isinstance(metrics, Mapping):
            named = dict(metrics)
        else:
            items = [metrics, *additional] if not isinstance(metrics, (list, tuple)) else [*metrics, *additional]
            named = {}
            for metric in items:
                name = type(metric).__name__
                if name in named:
                    raise ValueError(f"MetricCollection: two metrics of class {name}; pass a dict to name them.")
                named[name] = metric
        for name, metric in named.items():
            if not is_metric(metric):
                raise TypeError(f"MetricCollection: {name!r} is {metric!r}, not a metric (an object with "
                                "`merge` and `compute`, e.g. fitjax.metrics.F1Score).")
        for option, value in (("prefix", prefix), ("postfix", postfix)):
            if value is not None and not isinstance(value, str):
                raise ValueError(f"MetricCollection({option}=...) must be a string, got {value!r}.")
        self._metrics = named
        self.prefix, self.postfix = prefix or "", postfix or ""

    def _key(self, name: str) -> str:
        return f"{self.prefix}{name}{self.postfix}"

    def __getitem__(self, key: str) -> Any:
        for name, metric in self._metrics.items():
            if self._key(name) == key or name == key:
                return metric
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return (self._key(name) for name in self._metrics)

    def __len__(self) -> int:
        return len(self._metrics)

    def _replaced(self, metrics: dict[str, Any]) -> "MetricCollection":
        return MetricCollection(metrics, prefix=self.prefix, postfix=self.postfix)

    def update(self, *args: Any, **kwargs: Any) -> "MetricCollection":
        """Every metric updated with the same inputs (a new collection)."""
        return self._replaced({name: metric.update(*args, **kwargs) for name, metric in self._metrics.items()})

    def __call__(self, *args: Any, **kwargs: Any) -> "MetricCollection":
        return self.update(*args, **kwargs)

    def merge(self, other: "MetricCollection") -> "MetricCollection":
        return self._replaced({name: metric.merge(other._metrics[name]) for name, metric in self._metrics.items()})

    def compute(self) -> dict[str, Any]:
        """`{prefixed name: value}`."""
        return {self._key(name): metric.compute() for name, metric in self._metrics.items()}

    def clone(self, prefix: str | None = None, postfix: str | None = None) -> "MetricCollection":
        """The same metrics under another prefix / postfix (torchmetrics' `clone`)."""
        # copies: a declaration's updates are recorded by its identity, so two collections must not share one
        return MetricCollection({k: copy.copy(m) for k, m in self._metrics.items()}, prefix=prefix, postfix=postfix)

    def reset(self) -> "MetricCollection":
        return self
