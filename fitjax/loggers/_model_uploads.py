"""Which checkpoints a logger with `log_model` still has to upload (MLflow, W&B)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from fitjax import checkpoint

def check_log_model(owner: str, log_model: object) -> bool | str:
    if not (log_model is False or log_model is True or log_model == "all"):
        raise ValueError(
            f"`{owner}(log_model=...)` must be False (no checkpoints), True (the checkpoints kept at "
            f"the end of fit) or 'all' (each checkpoint as it is saved); got {log_model!r}."
        )
    return log_model  # type: ignore[return-value]


def require(owner: str, module: str, extra: str) -> None:
    """Raises at construction when the logger's package is missing, with the install command."""
    if importlib.util.find_spec(module) is None:
        raise ImportError(
            f"`{owner}` needs the `{module}` package, which is not installed. "
            f"Install it with `pip install 'fitjax[{extra}]'`."
        )


class ModelUploads:
    """Tracks the `ModelCheckpoint` callbacks seen and the checkpoint folders already uploaded.

    Orbax saves in the background and a checkpoint folder appears under its name only once
    complete, so a save announced by `after_save_checkpoint` is uploaded at the next call (or at
    `finalize`) that finds it complete. A folder the callback deleted before then (a `save_top_k`
    loser) is never uploaded.
    """

    def __init__(self, log_model: bool | str) -> None:
        self.log_model = log_model
        self._callbacks: list[Any] = []
        self._done: set[Path] = set()

    def saved(self, checkpoint_callback: Any) -> list[Path]:
        """Notes a save; returns the folders to upload now ("all": every complete new one)."""
        if not self.log_model:
            return []
        if checkpoint_callback not in self._callbacks:
            self._callbacks.append(checkpoint_callback)
        return self.pending() if self.log_model == "all" else []

    def pending(self) -> list[Path]:
        """Complete checkpoint folders of the callbacks seen that were not uploaded yet, oldest first.

        Marks them uploaded: the caller uploads them now.
        """
        found = []
        for callback in self._callbacks:
            folder = getattr(callback, "dirpath", None)
            if folder is None or not Path(folder).is_dir():
                continue
            for path in Path(folder).iterdir():
                if path not in self._done and checkpoint.is_checkpoint(path):
                    found.append(path)
        found.sort(key=lambda p: p.stat().st_mtime)
        self._done.update(found)
        return found

    def best_paths(self) -> set[Path]:
        """The callbacks' current `best_model_path`s."""
        return {Path(c.best_model_path) for c in self._callbacks if getattr(c, "best_model_path", "")}
