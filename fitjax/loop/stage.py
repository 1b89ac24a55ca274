"""What the loop is running now, as hooks read it: one frozen `Stage` the loop replaces when a
stage starts or ends (`trainer.stage`). Hooks learn from it what Lightning's hooks learn from
trainer flags (`trainer.sanity_checking`, `validate(verbose=...)`), and cannot change it.

Example:
    >>> import fitjax as fj
    >>> class Quiet(fj.Callback):
    ...     def on_validation_end(self, trainer, module):
    ...         if not trainer.stage.sanity_checking and trainer.stage.verbose:
    ...             print(trainer.stage.name, trainer.callback_metrics)
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

__all__ = ["Stage", "in_precision"]


def in_precision(method: Callable) -> Callable:
    """A Trainer stage method run inside its precision's context (`Precision.context()`: 64-bit
    JAX for "64-true", nothing otherwise)."""

    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with self.step_options.precision.context():
            return method(self, *args, **kwargs)

    return run


@dataclasses.dataclass(frozen=True)
class Stage:
    """The stage running now.

    Attributes:
        name: "fit", "validate", "test", "predict", or None between them (Lightning's
            `trainer.state.fn`).
        sanity_checking: the validation batches fit runs before training (Lightning's
            `trainer.sanity_checking`).
        verbose: `validate`/`test`'s `verbose=`: whether their results are printed.
    """

    name: str | None = None
    sanity_checking: bool = False
    verbose: bool = True
