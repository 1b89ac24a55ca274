"""`RunResults`: each run's final values and its values at its best, from the rows the loop logs.

It receives every row the loggers receive (`MetricLog` writes to it as to a logger), keeps each
run's latest value of every key and a copy of them at the row where the run's monitored value
was best; at a successful end of fit it logs the table. Nothing per step: a row is a dict the
loop already made.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Mapping, Sequence

from fitjax.runs._axis import run_suffix
from fitjax.runs._stops import RunStops

__all__ = ["RunResults"]

log = logging.getLogger("fitjax")

# What `best_run` compares when no monitor is given: the first of these a fit logged (min).
_DEFAULT_MONITORS = ("val/loss", "train/loss_epoch", "train/loss")


class RunResults:
    """Each run's final values and its values where its monitored value was best.

    Args:
        names: each run's name (`Runs.names`).
        monitor: the key the best is judged by (without the run suffix), or None: the first of
            `val/loss`, `train/loss_epoch`, `train/loss` the fit logs.
        mode: "min" or "max" for `monitor`.
        stops: where runs stopped early (a run's rows after its stop are not its own); its own
            when None.
    """

    def __init__(self, names: Sequence[str], *, monitor: str | None = None, mode: str = "min",
                 stops: RunStops | None = None):
        self.names = tuple(names)
        self.stops = RunStops(len(self.names)) if stops is None else stops
        self._monitors = (monitor,) if monitor else _DEFAULT_MONITORS
        self._mode = mode if monitor else "min"
        self._suffixes = {run_suffix(i): i for i in range(len(self.names))}
        self.final: list[dict[str, float]] = [{} for _ in self.names]
        # monitor -> per run: (best value, every value at that row)
        self._best: dict[str, list[tuple[float, dict[str, float]] | None]] = {
            m: [None] * len(self.names) for m in self._monitors}

    # ---------------------------------------------------------------------- what the loop calls

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Takes a logged row: each `<key>/run_<i>` value is run i's `<key>` (none after its stop)."""
        touched = set()
        for key, value in metrics.items():
            base, mark, index = key.rpartition("/run_")
            i = self._suffixes.get(mark + index) if mark else None
            if i is not None and self.stops.logs(i, step):
                self.final[i][base] = float(value)
                touched.add(i)
        for monitor, best in self._best.items():
            for i in touched:
                value = self.final[i].get(monitor)
                if value is None or monitor + run_suffix(i) not in metrics or math.isnan(value):
                    continue
                if best[i] is None or self._better(value, best[i][0]):
                    best[i] = (value, dict(self.final[i]))

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        """The runs' hyperparameters are their names'."""

    def log_pictures(self, pictures: Mapping[str, Any], step: int) -> None:
        """Pictures are for the loggers that draw them."""

    def finalize(self, status: str) -> None:
        """At a successful end of fit, logs the table (process 0 logs it)."""
        if status == "success" and self.monitor is not None:
            log.info("%s", self.table())

    # ---------------------------------------------------------------------------- the reads

    @property
    def monitor(self) -> str | None:
        """The key runs are compared by: the given one, else the first default one logged."""
        return next((m for m in self._monitors if any(b is not None for b in self._best[m])), None)

    @property
    def best(self) -> list[dict[str, float]]:
        """Each run's values at the row where its monitored value was best ({} if never logged)."""
        monitor = self.monitor
        if monitor is None:
            return [{} for _ in self.names]
        return [dict(b[1]) if b is not None else {} for b in self._best[monitor]]

    @property
    def best_run(self) -> int | None:
        """The run whose monitored value was best of all (None before any was logged)."""
        monitor = self.monitor
        if monitor is None:
            return None
        scored = [(b[0], i) for i, b in enumerate(self._best[monitor]) if b is not None]
        return (min if self._mode == "min" else max)(scored)[1]

    def table(self) -> str:
        """The runs, one line each: the monitored value at the end (a stopped run's: at its
        stop) and at its best, then each other validation (or train epoch) value at the end; the
        epoch each run stopped in when any stopped early; the best run marked."""
        monitor, best, best_run = self.monitor, self.best, self.best_run
        shown = [k for k in dict.fromkeys(k for row in self.final for k in row) if k != monitor]
        prefix = "val/" if any(k.startswith("val/") for k in shown) else "train/"
        shown = [k for k in shown if k.startswith(prefix) and (prefix == "val/" or k.endswith("_epoch"))]
        stopped = self.stops.stopped
        header = ["run", "name", f"{monitor} (end)", f"{monitor} (best)", *(f"{k} (end)" for k in shown),
                  *(["stopped (epoch)"] if stopped else [])]
        rows = []
        for i, name in enumerate(self.names):
            values = [self.final[i].get(monitor), best[i].get(monitor), *(self.final[i].get(k) for k in shown)]
            mark = "*" if i == best_run else " "
            rows.append([f"{i}{mark}", name, *(_number(v) for v in values),
                         *([_stop(self.stops, i)] if stopped else [])])
        widths = [max(len(str(r[c])) for r in [header, *rows]) for c in range(len(header))]
        lines = ["  ".join(str(cell).ljust(w) for cell, w in zip(row, widths)).rstrip() for row in [header, *rows]]
        title = f"Runs ({len(self.names)}), best by {monitor} ({self._mode}): run {best_run} ({self.names[best_run]})"
        return "\n".join([title, *lines])

    def _better(self, value: float, than: float) -> bool:
        return value < than if self._mode == "min" else value > than


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _stop(stops: RunStops, run: int) -> str:
    """The epoch run `run` stopped in, "-" while it trains ("yes": stopped before a resumed fit)."""
    if stops.last_row[run] is None:
        return "-"
    return "yes" if stops.epoch[run] is None else str(stops.epoch[run])
