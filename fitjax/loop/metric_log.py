"""The metric log: where the loop's values go (the loggers, `callback_metrics`, the progress
bar's values), and the one owner of them.

`MetricLog` is built with what it writes to and reads from (the loggers, the profiler, the
compile times, the loop's position, read-only) and owns `callback_metrics`, `logged_metrics`,
`progress_bar_metrics`, the train epoch's accumulators (`EpochAccumulators`, what a checkpoint
stores of it) and the train log windows on their way to the host. The loop tells it when it may
fetch: `start_window` at a log step, `read_arrived` after each step, `finish_windows` before a
validation or a save, `log_train_epoch` at an epoch's end, `end_fit` when fit ends. Its reads
(`callback_metrics`, `epoch_accumulators`) write nothing to the loggers.

The train values reach the host in windows (`fitjax.loop._log_fetch`): one is started at a log
step and read at a later step, once it has arrived, so the loop never waits for the device to log.

Example:
    >>> from fitjax.loop.metric_log import MetricLog
    >>> from fitjax.loop.progress import Progress, ProgressView
    >>> from fitjax.profilers import resolve_profiler
    >>> from fitjax.profilers._compile import CompileTimes
    >>> progress = Progress()
    >>> log = MetricLog([], profiler=resolve_profiler(None), compile_times=CompileTimes(),
    ...                 progress=ProgressView(progress), on_window_logged=progress.logged)
    >>> log.log({"val/loss": 0.5}, aliases={"loss": 0.5})
    >>> log.callback_metrics
    {'loss': 0.5, 'val/loss': 0.5}
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np

from fitjax import _logged
from fitjax import step as step_lib
from fitjax import metrics as acc_lib
from fitjax._typing import HostMetrics
from fitjax.loop import _log_fetch
from fitjax.loop.progress import Position, ProgressView
from fitjax.state import TrainState

__all__ = ["EpochAccumulators", "MetricLog"]

_IN_FLIGHT = 4  # log windows on their way to the host at most (each holds a few scalars)


@dataclasses.dataclass(frozen=True)
class EpochAccumulators:
    """The train epoch's `(total, weight)` accumulators on the host, by name: the epoch's means
    come from them, and a checkpoint taken mid-epoch stores them, so a resumed epoch logs the
    means of the whole epoch."""

    acc: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict)

    def merged(self, host: Mapping[str, np.ndarray]) -> EpochAccumulators:
        """These plus `host` (a window's accumulators)."""
        return EpochAccumulators(acc_lib.merge_host(self.acc, host))

    def to_meta(self) -> dict[str, Any]:
        """As plain (JSON) data, bitwise: float64 values (a metric's state: its arrays and dtypes)."""
        return {k: acc_lib.to_plain(v) for k, v in self.acc.items()}

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any]) -> EpochAccumulators:
        """The accumulators `to_meta` wrote."""
        return cls({k: acc_lib.from_plain(v) for k, v in meta.items()})


class MetricLog:
    """The values logged by a Trainer: the loggers' rows, `callback_metrics`, the progress bar's.

    Args:
        loggers: the loggers every row goes to (the Trainer's list).
        profiler: times the loggers' writes and the waits for the device.
        compile_times: compile seconds, logged with the next row (`compile/<program>_s`).
        progress: the loop's position, read-only (the step and epoch of rows and windows).
        on_window_logged: told the position and the progress-bar values of each train window that
            reached the loggers (`Progress.logged`).
    """

    def __init__(self, loggers: list, *, profiler: Any, compile_times: Any, progress: ProgressView,
                 on_window_logged: Callable[[Position, HostMetrics], None]) -> None:
        self._loggers = loggers
        self._profiler = profiler
        self._compile_seconds = compile_times
        self._loop = progress
        self._on_window_logged = on_window_logged
        self._callback_metrics: HostMetrics = {}
        self.logged_metrics: HostMetrics = {}  # every key's latest value written to the loggers
        self.progress_bar_metrics: HostMetrics = {}  # the progress bar's values
        self._epoch = EpochAccumulators()
        self._specs: dict = {}  # the fit's `LitModule.log` options by name
        self._fitting = False  # rows default to Lightning's fit step (`global_step - 1`)
        self._windows: collections.deque = collections.deque()  # (log window on its way, writes rows)
        self._latest_step: dict | None = None  # the last train step's values, on the device
        self._latest_step_host: tuple | None = None  # (those values, read) once someone read them

    # ---------------------------------------------------------------------------- reads

    @property
    def callback_metrics(self) -> HostMetrics:
        """The latest value of every logged key (see `Trainer.callback_metrics`): with the train
        windows on their way and the last step's values (read from the device now, once per
        step and window); nothing reaches the loggers (the loop logs the windows later)."""
        # the same updates the loop makes when it logs the windows: the dict itself is returned,
        # as Lightning's callbacks update it
        self._callback_metrics.update(self._pending_callback_metrics())
        self._callback_metrics.update(self._latest_step_metrics())  # newer than any window
        return self._callback_metrics

    @property
    def epoch_accumulators(self) -> EpochAccumulators:
        """The train epoch's accumulators as the windows read so far left them."""
        return self._epoch

    # ---------------------------------------------------------------- the loop's writes

    def begin_fit(self, specs: dict) -> None:
        """A fit starts with steps whose `LitModule.log` options are `specs`."""
        self._specs, self._fitting = specs, True
        self._latest_step = self._latest_step_host = None

    def end_fit(self) -> None:
        """Fit ends: the values of an interrupted window, or of the last step, are not logged."""
        self._windows.clear()
        self._latest_step = self._latest_step_host = None
        self._fitting = False

    def start_epoch(self, accumulators: EpochAccumulators | None = None) -> None:
        """A train epoch starts: its means start from `accumulators` (a resumed epoch's) or none."""
        self._epoch = accumulators or EpochAccumulators()

    def step_done(self, outputs: dict) -> None:
        """Keeps a reference to a train step's values (read only if `callback_metrics` is)."""
        self._latest_step = outputs

    def log(self, values: HostMetrics, *, aliases: HostMetrics | None = None,
            progress_bar: HostMetrics | None = None, pictures: Mapping[str, np.ndarray] | None = None) -> None:
        """Records `values` as the latest and writes them to the loggers; `aliases` (Lightning's
        plain names of forked values) go to `callback_metrics` only, `progress_bar` to the bar,
        `pictures` (a confusion matrix) to the loggers that draw them.

        The step is Lightning's: during fit the index of the last step taken (`global_step - 1`),
        else `global_step`."""
        if progress_bar:
            self.progress_bar_metrics.update(progress_bar)
        while self._windows and self._windows[0][0].was_read:  # read by `callback_metrics`:
            self._read_oldest_window()  # its rows first, so the loggers get rows in step order
        step = self._loop.global_step
        self._write(values, step=max(step - 1, 0) if self._fitting else step, epoch=self._loop.epoch,
                    aliases=aliases, pictures=pictures)

    def log_hook(self, logged: _logged.Logged, *, owner: str, hook: str) -> None:
        """Logs what a host hook passed to `self.log` (under the names given)."""
        values = _logged.host_values(logged, owner=owner, hook=hook)
        self.log(values, progress_bar={k: values[k] for k in logged.specs if logged.specs[k].prog_bar})

    def start_window(self, state: TrainState, reset: Callable[[TrainState], TrainState], *,
                     log_rows: bool = True) -> TrainState:
        """Starts fetching the state's accumulators; returns the state with them reset (`reset`).
        `log_rows=False`: they only join the epoch's means (the end of an epoch).

        The windows before it stay on their way until they have arrived (`read_arrived`), at
        most `_IN_FLIGHT` of them: reading one that has not arrived makes the host wait for the
        device and then wake up, and on a loaded machine that wake-up can leave the device idle
        for longer than the step (several steps per call put a log step in most calls)."""
        self.read_arrived()
        while len(self._windows) >= _IN_FLIGHT:
            self._read_oldest_window()
        progress = self._loop
        state, window = _log_fetch.start(state, reset, step=progress.global_step, epoch=progress.epoch,
                                         batches_done=progress.batches_done)
        self._windows.append((window, log_rows))
        return state

    def read_arrived(self) -> None:
        """Logs the windows whose values have reached the host, oldest first (never waits)."""
        while self._windows and self._windows[0][0].ready():
            self._read_oldest_window()

    def finish_windows(self) -> None:
        """Logs every window on its way, oldest first, each at the step it ended (waits for them)."""
        while self._windows:
            self._read_oldest_window()

    def log_train_epoch(self, state: TrainState, reset: Callable[[TrainState], TrainState]) -> TrainState:
        """Logs the train epoch's means (the windows read so far and the steps since the last log
        step, fetched now); returns the state with its accumulators reset."""
        self.finish_windows()
        state = self.start_window(state, reset, log_rows=False)  # the steps since the last log step
        self.finish_windows()
        if self._latest_step is not None:  # newer than the windows, older than the epoch's means
            self._callback_metrics.update(self._latest_step_metrics())  # (which Lightning writes
        self._latest_step = self._latest_step_host = None  # over the plain names of both)
        acc, specs = self._epoch.acc, self._specs
        self.log(_logged.compute(acc, specs, stage="train", epoch=True),
                 aliases=_logged.plain_names(acc, specs, epoch=True),
                 pictures=_logged.pictures(acc, specs, stage="train", epoch=True))
        return state

    def finalize(self, status: str) -> None:
        """Tells every logger the run ended with `status` ("success", "failed", "interrupted")."""
        for logger in self._loggers:
            logger.finalize(status)

    # -------------------------------------------------------------------------- inside

    def _write(self, values: HostMetrics, *, step: int, epoch: int, aliases: HostMetrics | None = None,
               pictures: Mapping[str, np.ndarray] | None = None) -> None:
        """Writes `values` to the loggers at `step` (with the compile times taken since the last row)."""
        if pictures:
            with self._profiler.profile("[log] loggers"):
                for logger in self._loggers:
                    logger.log_pictures(pictures, step=step)
        if aliases:
            self._callback_metrics.update(aliases)
        compiled = self._compile_seconds.take()  # compile/<program>_s: for the loggers, not the callbacks
        if not values and not compiled:
            return
        self._callback_metrics.update(values)
        self.logged_metrics.update({**values, **compiled})
        row = {**values, **compiled, "epoch": float(epoch)}
        with self._profiler.profile("[log] loggers"):
            for logger in self._loggers:
                logger.log_metrics(row, step=step)

    def _read_oldest_window(self) -> None:
        """Logs the means of the oldest window on its way (waits for it).

        Rows are written at step `global_step - 1` of the step that ended the window, as
        Lightning does (its first row of `log_every_n_steps=n` is at step n-1)."""
        window, log_rows = self._windows.popleft()
        with self._profiler.profile("[sync] log step values"):  # waits for the device
            host, extra = window.read()
        # merged even when empty: a resumed epoch's saved metric states take the window's structure
        self._epoch = self._epoch.merged(_logged.keep(host, self._specs, "on_epoch"))
        if not acc_lib.has_weight(host):
            return
        if not log_rows:
            return
        at = {"step": window.step - 1, "epoch": window.epoch}
        extra, values, aliases = self._window_rows_of(host, extra)
        self._write(extra, **at)
        self.progress_bar_metrics.update(_logged.for_progress_bar(values, self._specs))
        self._write(values, aliases=aliases, **at)
        self._on_window_logged(Position(window.epoch, window.batches_done, window.step), self.progress_bar_metrics)

    def _window_rows_of(self, host: dict, extra: dict) -> tuple[HostMetrics, HostMetrics, HostMetrics]:
        """A window's host values as its rows log them: the extra values, the on-step means and
        their plain names (Lightning's aliases)."""
        on_step = _logged.keep(host, self._specs, "on_step")
        return ({name: float(value) for name, value in extra.items()},
                _logged.compute(on_step, self._specs, stage="train", epoch=False),
                _logged.plain_names(on_step, self._specs, epoch=False))

    def _pending_callback_metrics(self) -> HostMetrics:
        """What `callback_metrics` holds once the windows on their way are logged (waits for
        them; writes nothing: the loop logs them before its next write to the loggers)."""
        pending: HostMetrics = {}
        for window, log_rows in self._windows:
            host, extra = window.read()
            if log_rows and acc_lib.has_weight(host):
                extra, values, aliases = self._window_rows_of(host, extra)
                pending.update({**extra, **aliases, **values})  # `_write`'s order of updates
        return pending

    def _latest_step_metrics(self) -> HostMetrics:
        """The last train step's on-step values under their logged keys (Lightning's
        `callback_metrics` after every step); read from the device once per step, only when
        someone asks (`callback_metrics`)."""
        outputs = self._latest_step
        if outputs is None:
            return {}
        cached = self._latest_step_host
        if cached is not None and cached[0] is outputs:
            return cached[1]
        host = jax.device_get({k: v for k, v in outputs.items() if k != step_lib.train.ANOMALY_KEY})
        acc = {k: np.array([v, 1.0]) for k, v in host.items() if np.ndim(v) == 0}
        on_step = _logged.keep(acc, self._specs, "on_step")
        values = {**_logged.plain_names(on_step, self._specs, epoch=False),
                  **_logged.compute(on_step, self._specs, stage="train", epoch=False)}
        self._latest_step_host = (outputs, values)
        return values
