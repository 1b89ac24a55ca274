"""Loggers: where the trainer sends metrics and hyperparameters (TensorBoard, CSV, your own)."""

from fitjax.loggers._base import Logger
from fitjax.loggers._csv import CSVLogger
from fitjax.loggers._resolve import resolve_loggers
from fitjax.loggers._tensorboard import TensorBoardLogger

__all__ = ["CSVLogger", "Logger", "TensorBoardLogger", "resolve_loggers"]
