"""Loggers: where the trainer sends metrics and hyperparameters (TensorBoard, CSV, your own)."""

from fitjax.loggers._base import Logger

__all__ = ["Logger"]
