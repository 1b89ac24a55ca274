"""`RunsLogger`: one logger's rows of a fit of several runs (`Trainer(runs=...)`), each run's
values in a run of its own.

The loop logs each run's values under `<key>/run_<i>`. A `TensorBoardLogger` or `CSVLogger` gets
a sub-folder per run, named by what differs (`seed=3`, `lr=0.003`), where run i's values are
logged under their plain keys (`train/loss`): TensorBoard overlays the runs' curves in one
chart, and its HPARAMS tab compares them (each sub-folder's session holds its run's
hyperparameters). The values that belong to no run (`epoch`, compile times) stay in the
logger's own folder. A run stopped early (`EarlyStopping`) gets no row after its stop. Any other
logger gets the rows as they are.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from fitjax.loggers._base import Logger
from fitjax.loggers._csv import CSVLogger
from fitjax.loggers._tensorboard import TensorBoardLogger
from fitjax.runs import RunStops

__all__ = ["RunsLogger", "split_by_run"]

_MARK = "/run_"


def split_by_run(loggers: Sequence[Logger], names: Sequence[str], hparams: Sequence[Mapping[str, Any]], *,
                 stops: RunStops | None = None) -> list:
    """`loggers`, those that can write a run per folder wrapped in a `RunsLogger`."""
    return [RunsLogger(logger, names, hparams, stops=stops) if isinstance(logger, (TensorBoardLogger, CSVLogger))
            else logger for logger in loggers]


class RunsLogger:
    """Writes the values of run i to a logger of the same kind in `<log_dir>/<names[i]>`.

    Args:
        logger: a `TensorBoardLogger` or `CSVLogger` (its own folder keeps the shared values).
        names: each run's folder name.
        hparams: what each run's HPARAMS session adds to the module's hyperparameters.
        stops: where runs stopped early: a run's folder gets no row after its stop (None: none stop).
    """

    def __init__(self, logger: Logger, names: Sequence[str], hparams: Sequence[Mapping[str, Any]], *,
                 stops: RunStops | None = None):
        self.logger = logger
        self.names = tuple(names)
        self.hparams = tuple(dict(h) for h in hparams)
        self.stops = stops
        self._children: list[Logger] | None = None

    def children(self) -> list[Logger]:
        """Each run's logger, made at the first write (once the version folder is claimed)."""
        if self._children is None:
            parent = self.logger
            self._children = [type(parent)(parent.log_dir, name="", version=name,
                                           process_index=parent._process_index) for name in self.names]
        return self._children

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        self.logger.log_hyperparams(params)
        for child, own in zip(self.children(), self.hparams):
            child.log_hyperparams({**params, **own})

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        shared, per_run = {}, [{} for _ in self.names]
        for key, value in metrics.items():
            base, mark, index = key.rpartition(_MARK)
            if mark and index.isdigit() and int(index) < len(self.names):
                per_run[int(index)][base] = value
            else:
                shared[key] = value
        self.logger.log_metrics(shared, step)
        for i, (child, values) in enumerate(zip(self.children(), per_run)):
            if values and (self.stops is None or self.stops.logs(i, step)):  # its curve ends at its stop
                child.log_metrics({**values, **{k: v for k, v in shared.items() if k == "epoch"}}, step)

    def log_pictures(self, pictures: Mapping[str, Any], step: int) -> None:
        self.logger.log_pictures(pictures, step)

    def save(self) -> None:
        self.logger.save()
        for child in self._children or ():
            child.save()

    def finalize(self, status: str) -> None:
        self.logger.finalize(status)
        for child in self._children or ():
            child.finalize(status)
