"""The `optimizer:` section: an optax optimizer named in a config, typed by jsonargparse.

jsonargparse types a `class_path` section from a base class: a value is valid when it names a
subclass, or a function whose return annotation is one. optax optimizers are functions annotated
`-> GradientTransformation` (a NamedTuple, which jsonargparse does not take as a base), so
`OptaxOptimizer` is an abstract base that `GradientTransformation` is registered with: then
`class_path: optax.adamw` is checked against `optax.adamw`'s own signature (unknown or mistyped
arguments are parse errors). Schedules are in `fitjax.cli.schedules`.
"""

from __future__ import annotations

import abc
import functools
from typing import Any

import optax

__all__ = ["OptaxOptimizer", "build_optimizer"]


class OptaxOptimizer(abc.ABC):
    """What an `optimizer:` section names: any function returning an optax transformation.

    `class_path: optax.adamw` (or `optax.sgd`, `optax.contrib.muon`, or your own function
    annotated `-> optax.GradientTransformation`) with its arguments as `init_args`.
    """


OptaxOptimizer.register(optax.GradientTransformation)


def build_optimizer(optimizer: Any, lr_scheduler: Any = None) -> optax.GradientTransformation:
    """The transformation an `optimizer:` section (and its `lr_scheduler:`) describe.

    Both are jsonargparse specs (`class_path` + `init_args`, already checked against the
    signatures). The learning rate is given to `optax.inject_hyperparams`, so the value applied
    at each step is in the optimizer state, where `LearningRateMonitor` reads it; a schedule
    replaces the optimizer's `learning_rate`.
    """
    factory = _import(optimizer["class_path"])
    kwargs = dict(optimizer.get("init_args") or {})
    if lr_scheduler is not None:
        schedule_cls = _import(lr_scheduler["class_path"])
        kwargs["learning_rate"] = schedule_cls(**dict(lr_scheduler.get("init_args") or {}))
    if "learning_rate" not in kwargs or kwargs["learning_rate"] is None:
        return factory(**kwargs)
    learning_rate = kwargs.pop("learning_rate")
    # Only the learning rate is injected; the other arguments stay Python values (flags, dtypes).
    return optax.inject_hyperparams(functools.partial(factory, **kwargs))(learning_rate=learning_rate)


def _import(path: str) -> Any:
    module, _, name = path.rpartition(".")
    return getattr(__import__(module, fromlist=[name]), name)
