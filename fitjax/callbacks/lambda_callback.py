"""`LambdaCallback`: a callback made from functions passed by hook name, as Lightning's."""

from __future__ import annotations

from typing import Callable

from fitjax.callbacks._base import HOOKS, Callback

__all__ = ["LambdaCallback"]


class LambdaCallback(Callback):
    """Calls the functions given by hook name, with the hook's arguments (trainer, module, ...).

    Each keyword is a hook name of `fj.Callback` (`on_train_epoch_end`, `setup`, ...); its function
    receives what the hook receives, e.g. `(trainer, module)` or `(trainer, module, outputs, batch,
    batch_idx)`. A hook given `None` is left out, as in Lightning. Hooks nobody passes are never
    called, so a per-batch hook costs nothing unless given.

    Args:
        **hooks: `hook_name=function`. A name that is not a hook raises `TypeError` listing the
            hooks fitjax calls.

    Example:
        >>> import fitjax as fj
        >>> epochs = []
        >>> cb = fj.LambdaCallback(on_train_epoch_end=lambda trainer, module: epochs.append(trainer.current_epoch))
    """

    def __init__(self, **hooks: Callable | None):
        unknown = sorted(set(hooks) - set(HOOKS))
        if unknown:
            raise TypeError(
                f"LambdaCallback got {', '.join(map(repr, unknown))}, which fitjax does not call as a "
                f"callback hook; pass functions for these hooks: {', '.join(sorted(HOOKS))}."
            )
        for name, function in hooks.items():
            if function is None:
                continue
            if not callable(function):
                raise TypeError(f"LambdaCallback({name}=...) must be callable or None, got {function!r}")
            setattr(self, name, function)  # an instance attribute: called unbound, as Lightning's

    def __repr__(self) -> str:
        given = [name for name in HOOKS if name in self.__dict__]
        return f"LambdaCallback({', '.join(given)})"
