"""The loop's configuration: the Trainer arguments that say how long fit runs, what it validates,
logs and limits, checked once and frozen.

`LoopConfig.create` checks every argument (each error names it, shows what it got and what is
allowed: `fitjax.loop._checks`) and applies Lightning's rewrites once: `max_epochs=1000` when
nothing bounds the run, `fast_dev_run`'s n batches of every stage in one epoch without a sanity
check, `overfit_batches` in place of the train and validation limits. `Trainer` builds one in
`__init__` and reads it through its Lightning-named properties (`trainer.max_epochs`,
`trainer.limits`, ...); nothing changes it afterwards.

Example:
    >>> from fitjax.loop.config import LoopConfig
    >>> config = LoopConfig.create(fast_dev_run=2, max_epochs=5)
    >>> config.max_epochs, config.max_steps, config.limits["val"], config.num_sanity_val_steps
    (1, 2, 2, 0)
"""

from __future__ import annotations

import dataclasses
import datetime
import types
from typing import Any, Mapping

from fitjax.loop import _checks as checks

__all__ = ["LoopConfig", "config_value"]

_STAGES = ("train", "val", "test", "predict")


@dataclasses.dataclass(frozen=True)
class LoopConfig:
    """The checked, frozen loop arguments of a `Trainer` (Lightning's names and meanings; see
    `Trainer`'s arguments). Made by `create`, which checks them and applies Lightning's rewrites.

    Attributes:
        max_epochs: epochs to train at most (None: no limit).
        max_steps: optimizer steps to train at most (None: no limit).
        min_epochs / min_steps: a stop request waits until these are done (None: no minimum).
        num_sanity_val_steps: validation batches before training (-1: all, 0: none).
        log_every_n_steps: log the train metrics every this many optimizer steps.
        check_val_every_n_epoch: validate in every n-th epoch (None: an int interval counts
            batches over the whole run).
        val_check_interval: batches (int), a fraction of an epoch (float), a duration
            (`datetime.timedelta`), or None (once an epoch).
        limits: each stage's batch limit ("train", "val", "test", "predict"), read-only.
        fast_dev_run: batches of every stage in a smoke test (0: off).
        overfit_batches: the same first batches every epoch (0: off).
        reload_dataloaders_every_n_epochs: ask the loader hooks again every n epochs (0: never).
        seed: the run's base random key.
    """

    max_epochs: int | None = 1000
    max_steps: int | None = None
    min_epochs: int | None = None
    min_steps: int | None = None
    num_sanity_val_steps: int = 2
    log_every_n_steps: int | None = 50
    check_val_every_n_epoch: int | None = 1
    val_check_interval: int | float | datetime.timedelta | None = None
    limits: Mapping[str, int | float | None] = dataclasses.field(
        default_factory=lambda: types.MappingProxyType(dict.fromkeys(_STAGES)))
    fast_dev_run: int = 0
    overfit_batches: int | float = 0
    reload_dataloaders_every_n_epochs: int | None = 0
    seed: int = 0

    @classmethod
    def create(
        cls,
        *,
        max_epochs: Any = None,
        max_steps: Any = None,
        max_time: Any = None,
        min_epochs: Any = None,
        min_steps: Any = None,
        num_sanity_val_steps: Any = 2,
        log_every_n_steps: Any = 50,
        check_val_every_n_epoch: Any = 1,
        val_check_interval: Any = None,
        limit_train_batches: Any = None,
        limit_val_batches: Any = None,
        limit_test_batches: Any = None,
        limit_predict_batches: Any = None,
        fast_dev_run: Any = False,
        overfit_batches: Any = 0.0,
        reload_dataloaders_every_n_epochs: Any = 0,
        seed: Any = None,
    ) -> "LoopConfig":
        """Checks the `Trainer` arguments of the same names (raising at the first bad one) and
        applies Lightning's rewrites. `max_time` is only asked whether it bounds the run (the
        `Timer` callback enforces it)."""
        # None and -1 mean unlimited (Lightning's -1); 0 trains nothing
        steps = checks.limit_or_unlimited("max_steps", max_steps)
        epochs = checks.limit_or_unlimited("max_epochs", max_epochs)
        if max_epochs is None and steps is None and max_time is None:
            epochs = 1000  # Lightning's default
        every_n_epoch = checks.positive_int_or_none("check_val_every_n_epoch", check_val_every_n_epoch)
        values = dict(
            max_epochs=epochs,
            max_steps=steps,
            min_epochs=checks.limit_or_unlimited("min_epochs", min_epochs, unlimited=False),
            min_steps=checks.limit_or_unlimited("min_steps", min_steps, unlimited=False),
            num_sanity_val_steps=checks.sanity_steps(num_sanity_val_steps),
            log_every_n_steps=checks.positive_int_or_none("log_every_n_steps", log_every_n_steps),
            check_val_every_n_epoch=every_n_epoch,
            val_check_interval=checks.val_check_interval(val_check_interval, every_n_epoch),
        )
        given = (limit_train_batches, limit_val_batches, limit_test_batches, limit_predict_batches)
        limits = {stage: checks.check_limit(f"limit_{stage}_batches", value) for stage, value in zip(_STAGES, given)}
        values["fast_dev_run"] = n = checks.fast_dev_run(fast_dev_run)
        if n:  # Lightning's: n batches of train and val, validation after them, no sanity check
            limits = dict.fromkeys(_STAGES, n)
            values.update(max_epochs=1, max_steps=n, val_check_interval=None, check_val_every_n_epoch=1,
                          num_sanity_val_steps=0)
        values["overfit_batches"] = overfit = checks.check_limit("overfit_batches", overfit_batches) or 0
        values["reload_dataloaders_every_n_epochs"] = checks.limit_or_unlimited(
            "reload_dataloaders_every_n_epochs", reload_dataloaders_every_n_epochs, unlimited=False)
        if overfit:  # Lightning's: it wins over limit_*_batches and fast_dev_run's
            limits.update(train=overfit, val=overfit)
        values["seed"] = 0 if seed is None else checks.seed(seed)
        return cls(limits=types.MappingProxyType(limits), **values)


class _ConfigValue:
    """A read-only attribute of the Trainer that is its `LoopConfig` field of the same name
    (`trainer.max_epochs` reads `trainer._config.max_epochs`): one line where it is declared,
    one Python call per read, as a property."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    def __get__(self, trainer: Any, owner: type | None = None) -> Any:
        return self if trainer is None else getattr(trainer._config, self._name)

    def __set__(self, trainer: Any, value: Any) -> None:
        raise AttributeError(f"Trainer.{self._name} is read-only: it is a `Trainer({self._name}=...)` argument, "
                             "fixed when the Trainer is made; make another Trainer to change it.")


def config_value() -> Any:
    """Declares a Trainer attribute read from its configuration: `max_epochs: int | None =
    config_value()` (typed as its annotation for type checkers)."""
    return _ConfigValue()
