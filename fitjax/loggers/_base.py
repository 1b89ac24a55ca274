"""The `Logger` interface the trainer talks to."""

from __future__ import annotations

import abc
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax

STATUSES = ("success", "failed", "interrupted")


class Logger(abc.ABC):
    """Where the trainer sends metrics and hyperparameters.

    The trainer calls `log_hyperparams` once when `fit` starts, `log_metrics` every time it fetches
    metrics from the device, `save` when it checkpoints and `finalize` when the run ends (also when
    it ends with an exception). A logger receives plain host values; it never sees the trainer.

    Only process 0 of a multi-host run should write; the built-in loggers do nothing on the others.

    Example:
        >>> class PrintLogger(Logger):
        ...     name = "print"
        ...     version = 0
        ...     def log_metrics(self, metrics, step):
        ...         print(step, dict(metrics))
        ...     def log_hyperparams(self, params):
        ...         print(dict(params))
        >>> PrintLogger().log_metrics({"train/loss": 0.5}, step=10)
        10 {'train/loss': 0.5}
    """

    _process_index: int | None = None  # a built-in logger's `process_index` argument

    def _is_writer(self) -> bool:
        """Whether this process writes: process 0 only (the built-in loggers ask before each write)."""
        # Asked lazily, not in __init__: jax.process_index() starts the backends, which must not
        # happen before the user calls jax.distributed.initialize().
        if self._process_index is None:
            self._process_index = jax.process_index()
        return self._process_index == 0

    @property
    @abc.abstractmethod
    def name(self) -> str:
        """The experiment name (the folder under `save_dir` for file loggers)."""

    @property
    @abc.abstractmethod
    def version(self) -> int | str:
        """The run's version within the experiment."""

    @property
    def save_dir(self) -> Path | None:
        """The root folder the logger writes under, or None when it writes no files."""
        return None

    @property
    def log_dir(self) -> Path | None:
        """The folder of this run, or None when the logger writes no files."""
        return None

    @abc.abstractmethod
    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Records host values (already Python floats) at the global `step`."""

    @abc.abstractmethod
    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        """Records the run's hyperparameters, a flat or nested mapping."""

    def log_pictures(self, pictures: Mapping[str, Any], step: int) -> None:
        """Records matrices a metric computed (a confusion matrix: `[C, C]` host arrays) at
        `step`; loggers that show pictures draw them, the others ignore them."""

    def claim_version(self) -> None:
        """Called by every process when a fit starts, before anything reads `log_dir`: a file
        logger makes its version folder then, so two runs started at once never share one."""

    def save(self) -> None:
        """Flushes what is buffered to storage."""

    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        """Called by `ModelCheckpoint` after each save it starts (Lightning's hook).

        The checkpoint is written in the background: its folder under
        `checkpoint_callback.dirpath` appears once complete. Loggers that upload checkpoints
        (`log_model`) use it; the others ignore it.
        """

    def finalize(self, status: str) -> None:
        """Flushes and closes; `status` is one of "success", "failed" or "interrupted".

        Must be safe to call twice and after an exception.
        """
        self.save()

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint must keep so that a resumed run continues this one."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores `state_dict()` output; called on resume before anything is logged."""


def check_status(owner: str, status: str) -> None:
    """Raises when `finalize(status)` gets a status the loggers do not know."""
    if status not in STATUSES:
        raise ValueError(
            f"`{owner}.finalize(status=...)` must be one of {', '.join(map(repr, STATUSES))}; "
            f"got {status!r}. Pass 'failed' when the run raised and 'interrupted' when it was stopped."
        )
