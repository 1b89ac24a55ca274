"""optax's learning-rate schedules as classes an `lr_scheduler:` section can name.

optax schedules are functions annotated `-> Callable[...]`, which jsonargparse cannot check against
a base class, so each public schedule of `optax.schedules` has a class here with the same name,
signature and docstring; constructing it returns optax's schedule. In a config:

    lr_scheduler:
      class_path: warmup_cosine_decay_schedule     # or fitjax.cli.schedules.warmup_cosine_decay_schedule
      init_args: {init_value: 0.0, peak_value: 0.003, warmup_steps: 50, decay_steps: 1000}

Unknown or mistyped arguments are parse errors, checked against optax's own signature.
"""

from __future__ import annotations

import abc
import inspect

import optax
from jsonargparse import class_from_function

__all__ = ["OptaxSchedule"]  # and one class per optax schedule, listed in `names()`


class OptaxSchedule(abc.ABC):
    """Base of what an `lr_scheduler:` section names: a class whose construction returns a
    schedule (`count -> learning rate`). Subclass it for your own schedule."""


def _classes() -> dict[str, type]:
    classes = {}
    for name in sorted(dir(optax.schedules)):
        fn = getattr(optax.schedules, name)
        if (name.endswith("_schedule") or name == "exponential_decay") and inspect.isfunction(fn):
            # sets the class as an attribute of this module: the class_path a saved config holds
            classes[name] = class_from_function(fn, func_return=OptaxSchedule, name=name)
    return classes


_CLASSES = _classes()


def names() -> list[str]:
    """The optax schedules an `lr_scheduler:` section can name by their optax name."""
    return sorted(_CLASSES)
