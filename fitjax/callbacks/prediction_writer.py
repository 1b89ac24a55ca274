"""`BasePredictionWriter`: Lightning's callback that writes predictions as `Trainer.predict` makes
them, so that `predict(..., return_predictions=False)` holds none of them in memory."""

from __future__ import annotations

from typing import Any, Sequence

import jax

from fitjax.callbacks._base import Callback

__all__ = ["BasePredictionWriter"]

_INTERVALS = ("batch", "epoch", "batch_and_epoch")


class BasePredictionWriter(Callback):
    """Writes predictions per batch, at the end of the run, or both (Lightning's `write_interval`).

    Subclass it and define `write_on_batch_end` and/or `write_on_epoch_end`. They receive host
    (numpy) predictions of the batch's real rows (no padding) and `batch_indices`: the positions
    of those rows in the predict data (with one process, the rows in input order). Reading a
    batch's predictions waits for its step (a host sync per batch; writing needs the values).
    With `write_interval="batch"` and `trainer.predict(..., return_predictions=False)` nothing is
    held after a batch is written: a data set larger than host memory streams to disk. "epoch"
    keeps every batch's predictions until `write_on_epoch_end` (Lightning's too).

    Example:
        >>> import numpy as np, fitjax as fj
        >>> class NpyWriter(fj.BasePredictionWriter):
        ...     def __init__(self, folder):
        ...         super().__init__(write_interval="batch")
        ...         self.folder = folder
        ...     def write_on_batch_end(self, trainer, module, prediction, batch_indices, batch,
        ...                            batch_idx, dataloader_idx):
        ...         np.save(f"{self.folder}/{batch_idx}.npy", prediction)
    """

    def __init__(self, write_interval: str = "batch") -> None:
        if write_interval not in _INTERVALS:
            raise ValueError(f"BasePredictionWriter(write_interval=...) must be one of {list(_INTERVALS)}, "
                             f"got {write_interval!r}.")
        self.interval = write_interval
        self._seen = 0
        self._predictions: list[Any] = []
        self._indices: list[list[int]] = []

    def write_on_batch_end(self, trainer, module, prediction: Any, batch_indices: Sequence[int] | None,
                           batch: Any, batch_idx: int, dataloader_idx: int) -> None:
        """Writes one batch's predictions (with `write_interval` "batch" or "batch_and_epoch")."""
        raise NotImplementedError(f"{type(self).__name__} must define write_on_batch_end for "
                                  f"write_interval={self.interval!r}.")

    def write_on_epoch_end(self, trainer, module, predictions: Sequence[Any], batch_indices: Sequence[Any]) -> None:
        """Writes every batch's predictions at the end (with "epoch" or "batch_and_epoch"), as
        Lightning passes them: `predictions` one entry per batch, `batch_indices` one list per
        loader of one list per batch (`[[[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]]`)."""
        raise NotImplementedError(f"{type(self).__name__} must define write_on_epoch_end for "
                                  f"write_interval={self.interval!r}.")

    def on_predict_start(self, trainer, module) -> None:
        if jax.process_count() > 1:  # a batch's outputs are then the global batch, on no one host
            raise NotImplementedError(
                f"{type(self).__name__}: prediction writers run with one process (this run has "
                f"{jax.process_count()}); predict with `return_predictions=True` and write on process 0.")
        self._seen, self._predictions, self._indices = 0, [], []

    def on_predict_batch_end(self, trainer, module, outputs: Any, batch: Any, batch_idx: int,
                             dataloader_idx: int = 0) -> None:
        prediction = jax.device_get(outputs)  # sync point: this batch's rows, for writing
        rows = jax.tree.leaves(prediction)[0].shape[0] if jax.tree.leaves(prediction) else 0
        indices = list(range(self._seen, self._seen + rows))
        self._seen += rows
        if self.interval != "epoch":
            self.write_on_batch_end(trainer, module, prediction, indices, batch, batch_idx, dataloader_idx)
        if self.interval != "batch":
            self._predictions.append(prediction)
            self._indices.append(indices)

    def on_predict_end(self, trainer, module) -> None:
        if self.interval != "batch":
            predictions, indices, self._predictions, self._indices = self._predictions, self._indices, [], []
            self.write_on_epoch_end(trainer, module, predictions, [indices])  # Lightning's: per loader
