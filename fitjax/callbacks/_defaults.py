"""The callbacks a `Trainer` adds by itself (progress bar, model summary), unless told not to."""

from __future__ import annotations

from typing import Iterable

from fitjax.callbacks._base import Callback
from fitjax.callbacks.progress import RichProgressBar
from fitjax.callbacks.summary import RichModelSummary


def with_defaults(callbacks: Iterable[Callback] | None, *, progress_bar: bool, model_summary: bool
                  ) -> list[Callback]:
    """The user's callbacks plus a default of each enabled kind they did not supply themselves;
    a disabled kind is removed even when supplied (Lightning's `enable_*` flags win)."""
    callbacks = list(callbacks or [])
    for cb in callbacks:
        if not isinstance(cb, Callback):
            raise TypeError(
                f"Trainer(callbacks=...) items must be fitjax.Callback instances, got "
                f"{type(cb).__name__}: {cb!r}"
            )
    for enabled, kind in ((model_summary, RichModelSummary), (progress_bar, RichProgressBar)):
        if not enabled:
            callbacks = [cb for cb in callbacks if not isinstance(cb, kind)]
        elif not any(isinstance(cb, kind) for cb in callbacks):
            callbacks.append(kind())
    return callbacks
