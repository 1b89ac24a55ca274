"""The Trainer's argument checks: each names the argument, shows what it got and what is allowed.

Kept apart from `trainer.py` so that the loop reads top to bottom without them.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax

from fitjax._accelerator import accelerator_devices, check_devices_match
from fitjax.callbacks import Callback, DefaultCheckpoint, ModelCheckpoint
from fitjax.module import LitModule


def positive_int_or_none(name: str, value: Any) -> int | None:
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value > 0):
        return value
    raise ValueError(f"Trainer({name}=...) must be a positive int or None, got {value!r}")


def check_limit(name: str, value: Any) -> int | float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or (
        isinstance(value, float) and value > 1.0
    ):
        raise ValueError(
            f"Trainer({name}=...) takes an int number of batches or a float fraction in [0, 1], "
            f"got {value!r}"
        )
    return value


def apply_limit(limit: int | float | None, total: int | None) -> int | None:
    if limit is None:
        return total
    if isinstance(limit, float):
        if total is None:
            raise ValueError("a fractional limit_*_batches needs data with a known length (len())")
        return int(total * limit) if limit < 1.0 else total
    return limit if total is None else min(limit, total)


def maybe_len(loader) -> int | None:
    try:
        return len(loader)
    except TypeError:
        return None


def select_devices(devices: Any, accelerator: str = "auto") -> list[jax.Device]:
    available = accelerator_devices(accelerator)
    if devices in ("auto", -1, None):
        return available
    if isinstance(devices, int) and not isinstance(devices, bool) and devices > 0:
        if devices > len(available):
            raise ValueError(
                f"Trainer(devices={devices}) asks for more devices than the {len(available)} "
                f"available ({available[0].platform}); use devices='auto' or at most {len(available)}."
            )
        return available[:devices]
    if isinstance(devices, Sequence) and devices and all(isinstance(d, jax.Device) for d in devices):
        check_devices_match(accelerator, devices)
        return list(devices)
    raise ValueError(
        f"Trainer(devices=...) takes 'auto', a positive int or a list of jax devices, got {devices!r}"
    )


def with_checkpointing(callbacks: list[Callback], enabled: bool) -> list[Callback]:
    """Adds the default `ModelCheckpoint` when enabled, and puts checkpoint callbacks last so
    that the states they save include every other callback's update of the same hook."""
    checkpoints = [cb for cb in callbacks if isinstance(cb, ModelCheckpoint)]
    if checkpoints and not enabled:
        raise ValueError(
            "Trainer(enable_checkpointing=False) was given a ModelCheckpoint in callbacks=; drop "
            "one of the two."
        )
    if enabled and not checkpoints:
        checkpoints = [DefaultCheckpoint()]  # saves spaced to cost at most 5% of the fit's time
    keys = [cb.state_key for cb in checkpoints]
    if len(set(keys)) < len(keys):  # Lightning raises too: one callback's saved state would be lost
        twin = next(key for key in keys if keys.count(key) > 1)
        raise ValueError(f"Trainer(callbacks=...) has two ModelCheckpoint with the state key {twin!r}; "
                         "give one of them another filename= (or monitor, mode, every_n_...) so "
                         "that each one's state is saved and resumed.")
    return [cb for cb in callbacks if not isinstance(cb, ModelCheckpoint)] + checkpoints


def check_module(module: Any) -> None:
    if not isinstance(module, LitModule):
        raise TypeError(
            f"expected a fitjax.LitModule, got {type(module).__name__}: {module!r}. Subclass "
            "`fj.LitModule` and define `loss` and `configure_optimizer`."
        )
    if "training" not in vars(module):
        raise RuntimeError(
            f"{type(module).__name__}.__init__ did not call `super().__init__()`; add it as the first line."
        )


def limit_or_unlimited(name: str, value: Any, *, unlimited: bool = True) -> int | None:
    """An int >= 0, or None; with `unlimited`, -1 (Lightning's "no limit") is None too."""
    if unlimited and value == -1 and not isinstance(value, bool):
        return None
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
        return value
    allowed = "an int >= 0, -1 (no limit) or None" if unlimited else "an int >= 0 or None"
    raise ValueError(f"Trainer({name}=...) must be {allowed}, got {value!r}")


def sanity_steps(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value >= -1:
        return value
    raise ValueError(
        f"Trainer(num_sanity_val_steps=...) must be an int >= -1 (-1: the whole validation set, 0: "
        f"no sanity check), got {value!r}"
    )


def fast_dev_run(value: Any) -> int:
    if not isinstance(value, (bool, int)) or value < 0:
        raise ValueError(f"Trainer(fast_dev_run=...) takes a bool or an int >= 0 (0 and False: off; True: 1 "
                         f"batch; n: n batches), got {value!r}")
    return int(value)


def seed(value: Any) -> int:
    if not isinstance(value, int):
        raise ValueError(f"Trainer(seed=...) must be an int, got {value!r}")
    return value


def val_check_interval(value: Any, check_val_every_n_epoch: int | None) -> int | float | None:
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, (int, float))
        or value <= 0 or (isinstance(value, float) and value > 1)
    ):
        raise ValueError(
            "Trainer(val_check_interval=...) takes an int number of train batches or a float "
            f"fraction of an epoch in (0, 1], got {value!r}"
        )
    if check_val_every_n_epoch is None and isinstance(value, float):
        raise ValueError(
            f"Trainer(val_check_interval={value!r}) must be an int number of train batches when "
            "check_val_every_n_epoch=None (validation is then counted over the whole run); pass an "
            "int, or set check_val_every_n_epoch."
        )
    return value


def val_check_batches(trainer, num_batches: int | None, *, validating: bool) -> int | None:
    """Validate every this many train batches; None: at the end of each epoch (data without a
    length, default interval). Lightning's `FitLoop.setup_data` rules and errors."""
    interval, per_epoch = trainer.val_check_interval, trainer.check_val_every_n_epoch is not None
    if isinstance(interval, int):
        if validating and per_epoch and num_batches is not None and interval > num_batches:
            raise ValueError(
                f"Trainer(val_check_interval={interval}) must be at most the number of train batches "
                f"per epoch ({num_batches}). To validate across epochs every {interval} batches set "
                "check_val_every_n_epoch=None; to disable validation set limit_val_batches=0."
            )
        return interval
    if num_batches is None:
        if interval not in (None, 1.0):
            raise ValueError(
                f"Trainer(val_check_interval={interval!r}): a fraction of an epoch needs train data "
                "with a known length (len()); pass an int number of batches instead."
            )
        return None
    return max(1, int(num_batches * (1.0 if interval is None else interval)))
