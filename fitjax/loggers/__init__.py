"""Loggers: where the trainer sends metrics and hyperparameters (TensorBoard, CSV, MLflow, W&B, your own).

`MLFlowLogger` and `WandbLogger` import their packages only when they first write; install them
with `pip install 'fitjax[mlflow]'` / `pip install 'fitjax[wandb]'`.
"""

from fitjax.loggers._base import Logger
from fitjax.loggers._csv import CSVLogger
from fitjax.loggers._mlflow import MLFlowLogger
from fitjax.loggers._resolve import resolve_loggers
from fitjax.loggers._tensorboard import TensorBoardLogger
from fitjax.loggers._wandb import WandbLogger

# For the CLI, not part of the user-facing API: the hyperparameters a parsed config logs.
from fitjax.loggers._hparams import config_hparams
# For the Trainer, not part of the user-facing API: a run per folder with `Trainer(runs=...)`.
from fitjax.loggers._runs import split_by_run

__all__ = ["CSVLogger", "Logger", "MLFlowLogger", "TensorBoardLogger", "WandbLogger", "resolve_loggers"]
