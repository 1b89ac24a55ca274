"""The metric log: where the loop's values go (the loggers, `callback_metrics`, the progress
bar's values), and the one owner of them.

The road of a logged value (the only one; `tests/loop/test_logging_road.py` holds it): every
number the loggers receive passes through `MetricLog`, and only `MetricLog._write` (and the
loggers themselves) call `Logger.log_metrics`. A new kind of value joins at one of three doors:
- values computed inside the jitted train step (the step's metrics, `LitModule.log` in `loss`):
  the loop hands them over in log windows (`start_window`), read when they reach the host;
- values of a host hook, the module's or a callback's: the hook calls `module.log(name, value)`
  (the public road, for fitjax's own callbacks too: `LearningRateMonitor`, `ThroughputMonitor`,
  `SpikeDetection`, `DeviceStatsMonitor`), `CallbackList.call` collects them and the loop passes
  them to `log_hook`;
- values the loop computes on the host (an evaluation's means, a stateful metric computed from
  its state when logged): `log(values, aliases=..., progress_bar=...)`.
`MetricLog` picks the row (Lightning's logger step, `_row`: the one place that rule lives), keeps
the rows in step order (a host row waits behind the windows still on their way), updates
`callback_metrics`, `logged_metrics` and the bar's values. `callback_metrics` is read-only to
everyone else: a callback that wants a value there logs it.

`MetricLog` is built with what it writes to and reads from (the loggers, the profiler, the
compile times, the loop's position, read-only) and owns `callback_metrics`, `logged_metrics`,
`progress_bar_metrics`, the train epoch's accumulators (`EpochAccumulators`, what a checkpoint
stores of it) and the train log windows on their way to the host. The loop tells it when it may
fetch: `start_window` at a log step, `read_arrived` after each step, `finish_windows` before a
validation or a save, `log_train_epoch` at an epoch's end, `end_fit` when fit ends. Its reads
(`callback_metrics`, `epoch_accumulators`) change nothing.

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
import types
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import jax
import numpy as np

from fitjax import _logged
from fitjax import step as step_lib
from fitjax import metrics as acc_lib
from fitjax._typing import HostMetrics
from fitjax.loop import _log_fetch
from fitjax.loop._step_rate import StepRate
from fitjax.loop.progress import Position, ProgressView
from fitjax.state import TrainState

__all__ = ["CallbackMetrics", "EpochAccumulators", "MetricLog"]

_IN_FLIGHT = 4  # log windows' transfers on their way to the host at most (each of a few scalars)


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


class CallbackMetrics(dict):
    """`trainer.callback_metrics`: the latest value of every logged key, read-only (a snapshot
    taken at the read). A value gets here by being logged: `module.log(name, value)` in a hook."""

    def _read_only(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError(
            "trainer.callback_metrics is read-only: it holds what was logged. To add a value (a "
            "callback's too), log it from a hook with `module.log(name, value)`: it reaches "
            "callback_metrics, the loggers and the monitors of ModelCheckpoint and EarlyStopping."
        )

    __setitem__ = __delitem__ = update = pop = popitem = setdefault = clear = __ior__ = _read_only


@dataclasses.dataclass(frozen=True)
class _Row:
    """Host values waiting behind a log window on its way, so that the loggers get rows in step
    order; `to_loggers=False`: they update `callback_metrics` (and the bar) only."""

    values: HostMetrics
    step: int
    epoch: int
    aliases: HostMetrics | None = None
    to_loggers: bool = True
    pictures: Mapping[str, np.ndarray] | None = None


class _Pending(NamedTuple):
    """What the rows on their way add to `callback_metrics` and `logged_metrics`."""

    callback: HostMetrics
    logged: HostMetrics


@dataclasses.dataclass(frozen=True)
class _EpochEnd:
    """A train epoch's end behind the windows on their way (the last of them its steps since the
    last log step): written once they are, it logs the epoch's means at `step` and starts the
    next epoch's accumulators. `latest`: the epoch's last step's values (on the device) and, when
    someone read them already, their host values: `callback_metrics` holds them before the means
    (Lightning writes the means over their plain names)."""

    step: int
    epoch: int
    latest: tuple[dict, HostMetrics | None] | None


def _is_window(entry: Any) -> bool:
    """Whether a queue entry is a log window (on its way), not a host entry behind them."""
    return isinstance(entry, tuple)


# the per-batch train hooks: what they log reaches the loggers at log steps only (Lightning's)
_BATCH_HOOKS = ("on_train_batch_start", "on_train_batch_end")


class MetricLog:
    """The values logged by a Trainer: the loggers' rows, `callback_metrics`, the progress bar's.

    Args:
        loggers: the loggers every row goes to (the Trainer's list).
        profiler: times the loggers' writes and the waits for the device.
        compile_times: compile seconds, logged with the next row (`compile/<program>_s`).
        progress: the loop's position, read-only (the step and epoch of rows and windows).
        on_window_logged: told the position, the progress-bar values and the steps per second
            of each train window that reached the loggers (`Progress.logged`).
        on_timed: told the steps per second each time finished steps were timed
            (`Progress.timed`; see `fitjax.loop._step_rate`).
        log_every_n_steps: what a per-batch train hook logs reaches the loggers at these steps.
    """

    def __init__(self, loggers: list, *, profiler: Any, compile_times: Any, progress: ProgressView,
                 on_window_logged: Callable[[Position, HostMetrics, float | None], None],
                 on_timed: Callable[[float], None] | None = None,
                 log_every_n_steps: int | None = None) -> None:
        self._loggers = loggers
        self._profiler = profiler
        self._compile_seconds = compile_times
        self._loop = progress
        self._on_window_logged = on_window_logged
        self._on_timed = on_timed
        # steps per second from the windows' arrivals: the device's speed, not the host's dispatch
        self._rate = StepRate(lambda: compile_times.seconds_total)
        self._every = log_every_n_steps
        self._callback_metrics: HostMetrics = {}
        self._logged_metrics: HostMetrics = {}  # every key's latest value written to the loggers
        # the progress bar's values: of the windows arrived (the bar never waits for the device)
        self.progress_bar_metrics: HostMetrics = {}
        self._epoch = EpochAccumulators()
        self._next_epoch = False  # a new epoch started behind an epoch's end on its way
        self._specs: dict = {}  # the fit's `LitModule.log` options by name
        self._fitting = False  # rows default to Lightning's fit step (`global_step - 1`)
        # in step order: log windows on their way `(window, log_rows, row)` and host entries
        # (`_Row`, `_EpochEnd`) behind them
        self._queue: collections.deque = collections.deque()
        # the log windows in `_queue`, counted as they come and go: asked at every log step and
        # epoch start, where walking the queue was a Python call per entry
        self._windows = 0
        self._fetch: _log_fetch.Fetcher | None = None  # how windows go to the host, per fit
        self._latest_step: dict | None = None  # the last train step's values, on the device
        self._latest_step_host: tuple | None = None  # (those values, read) once someone read them

    # ---------------------------------------------------------------------------- reads

    @property
    def callback_metrics(self) -> CallbackMetrics:
        """The latest value of every logged key (see `Trainer.callback_metrics`): with the rows
        on their way (train windows, read from the device now) and the last step's values (read
        once per step, when asked). A snapshot: reading changes nothing here or in the loggers."""
        pending = self._pending().callback
        block = _logged.open_host_block()  # what the hook running now logged: logged when it returns
        now = _logged.host_values(block, owner="module", hook="a hook") if block is not None else {}
        return CallbackMetrics({**self._callback_metrics, **pending, **self._latest_step_metrics(), **now})

    @property
    def logged_metrics(self) -> HostMetrics:
        """Every key's latest value written to the loggers, with the rows on their way (read from
        the device now, as `callback_metrics`; a compile time joins when its row is written)."""
        return {**self._logged_metrics, **self._pending().logged}

    @property
    def epoch_accumulators(self) -> EpochAccumulators:
        """The train epoch's accumulators as the windows read so far left them."""
        return self._epoch

    # ---------------------------------------------------------------- the loop's writes

    def begin_fit(self, specs: dict) -> None:
        """A fit starts with steps whose `LitModule.log` options are `specs`."""
        self._specs, self._fitting = specs, True
        self._latest_step = self._latest_step_host = None
        self._fetch = None

    def end_fit(self) -> None:
        """Fit ends: the values of an interrupted window, or of the last step, are not logged."""
        self._clear()
        self._next_epoch = False
        self._latest_step = self._latest_step_host = None
        self._fitting = False

    def start_epoch(self, accumulators: EpochAccumulators | None = None) -> None:
        """A train epoch starts: its means start from `accumulators` (a resumed epoch's) or none
        (the last epoch's end, still on its way, starts them when written)."""
        if accumulators is None and any(isinstance(entry, _EpochEnd) for entry in self._queue):
            self._next_epoch = True  # the last epoch's windows still merge into its means
        else:
            self._epoch = accumulators or EpochAccumulators()

    def time_finished(self, probe: jax.Array) -> None:
        """Waits for `probe` (a value of the last train step: `state.step`) and times the steps
        since the last window: a validation waits for them anyway, and its time is left out."""
        with self._profiler.profile("[sync] log step values"):
            probe.block_until_ready()
        self._timed(self._loop.global_step)

    def restart_speed(self) -> None:
        """Every train step so far has finished and what ran since was not training (an
        evaluation, the work between epochs): steps per second are timed from now. With windows
        on their way (an epoch's end not waited for) the device is still training: the interval
        runs on from the last point, and their reads time it."""
        if not self._windows:
            self._rate.restart(step=self._loop.global_step)

    def step_done(self, outputs: dict) -> None:
        """Keeps a reference to a train step's values (read only if `callback_metrics` is)."""
        self._latest_step = outputs

    def log(self, values: HostMetrics, *, aliases: HostMetrics | None = None,
            progress_bar: HostMetrics | None = None, pictures: Mapping[str, np.ndarray] | None = None) -> None:
        """Records `values` as the latest and writes them to the loggers (after the windows on
        their way: rows reach the loggers in step order); `aliases` (Lightning's plain names of
        forked values) go to `callback_metrics` only, `progress_bar` to the bar, `pictures` (a
        confusion matrix) to the loggers that draw them."""
        if progress_bar:
            self.progress_bar_metrics.update(progress_bar)
        self._enqueue(_Row(values, self._row(), self._loop.epoch, aliases, pictures=pictures))

    def log_hook(self, logged: _logged.Logged, *, owner: str, hook: str) -> None:
        """Logs what a host hook (the module's or a callback's) passed to `module.log`, under the
        names given. A per-batch train hook's values reach the loggers at log steps only, and
        `callback_metrics` and the bar at every call (Lightning's)."""
        values = _logged.host_values(logged, owner=owner, hook=hook)
        bar = {k: values[k] for k in logged.specs if logged.specs[k].prog_bar}
        if bar:
            self.progress_bar_metrics.update(bar)
        before = hook == "on_train_batch_start"
        to_loggers = hook not in _BATCH_HOOKS or self._log_step(before_step=before)
        self._enqueue(_Row(values, self._row(before_step=before), self._loop.epoch, to_loggers=to_loggers))

    def start_window(self, state: TrainState, reset: Callable[[TrainState], TrainState], *,
                     log_rows: bool = True) -> TrainState:
        """Starts fetching the state's accumulators; returns the state with them reset (`reset`).
        `log_rows=False`: they only join the epoch's means (the end of an epoch).

        The windows before it stay on their way until they have arrived (`read_arrived`), at
        most `_IN_FLIGHT` of them, or `_IN_FLIGHT` stacks of them when they are stacked (whose
        fetcher keeps the host `_IN_FLIGHT` windows ahead of the device at most, `_log_fetch`):
        reading one that has not arrived makes the host wait for the device and then wake up, and
        on a loaded machine that wake-up can leave the device idle for longer than the step
        (several steps per call put a log step in most calls)."""
        self.read_arrived()
        if self._fetch is None:  # once a fit: the accumulators keep their shapes and devices
            self._fetch = _log_fetch.Fetcher.for_values((state.metrics, step_lib.host_values(state)),
                                                        ahead=_IN_FLIGHT)
        while self._windows >= _IN_FLIGHT * self._fetch.windows_in_flight:
            self._write_oldest()
        progress = self._loop
        state, window = self._fetch.start(state, reset, step=progress.global_step, epoch=progress.epoch,
                                          batches_done=progress.batches_done)
        self._queue.append((window, log_rows, self._row()))
        self._windows += 1
        return state

    def read_arrived(self) -> None:
        """Logs the rows whose values have reached the host, oldest first (never waits)."""
        queue = self._queue
        if not queue:
            return
        head = queue[0]
        if isinstance(head, tuple) and not head[0].ready():  # `_is_window` inline: every step asks
            return  # every step but a few: nothing more to do
        arrived, last = 0, None  # the entries to write, the last window among them
        for entry in queue:
            if _is_window(entry):
                if arrived and not entry[0].ready():  # the first entry's was asked above
                    break
                last = entry[0]
            arrived += 1
        # windows seen arrived together finished at unknown times in between: they share the rate
        # of their steps together
        rate = self._timed(last.step) if last is not None else None
        for _ in range(arrived):
            self._write_oldest(rate)

    def finish_windows(self) -> None:
        """Logs every window on its way (and the rows behind them), oldest first (waits for them)."""
        while self._queue:
            self._write_oldest()

    def log_train_epoch(self, state: TrainState, reset: Callable[[TrainState], TrainState]) -> TrainState:
        """Logs the train epoch's means (the windows and the steps since the last log step);
        returns the state with its accumulators reset. Nothing waits here: the means are written
        behind the windows on their way, when those have arrived (`read_arrived`) or when someone
        needs them (`finish_windows`, the reads). Waiting here left the device idle from the
        epoch's last step until the host had started the next epoch: with `steps_per_execution`
        on CPU ~10% of the tiny MLP's speed (issue 62)."""
        state = self.start_window(state, reset, log_rows=False)  # the steps since the last log step
        outputs, read = self._latest_step, self._latest_step_host  # newer than the windows
        latest = None if outputs is None else (outputs, read[1] if read is not None and read[0] is outputs else None)
        self._queue.append(_EpochEnd(self._row(), self._loop.epoch, latest))
        self._latest_step = self._latest_step_host = None
        return state

    def finalize(self, status: str) -> None:
        """Tells every logger the run ended with `status` ("success", "failed", "interrupted"),
        after the rows of the epochs that ended (their means may still be on their way when a
        later step fails or is interrupted; the windows after them are not logged)."""
        ended = [i for i, entry in enumerate(self._queue) if isinstance(entry, _EpochEnd)]
        try:
            for _ in range(ended[-1] + 1 if ended else 0):
                self._write_oldest()
        except Exception:  # noqa: BLE001 - the device's failure: the fit's own error is the one raised
            self._clear()
        for logger in self._loggers:
            logger.finalize(status)

    # -------------------------------------------------------------------------- inside

    def _row(self, *, before_step: bool = False) -> int:
        """Lightning's logger step of a row logged now (its `_batches_that_stepped`): outside fit
        the global step; during fit the steps finished before the batch in progress, which is
        `global_step - 1` once its step ran (its train values, its hooks, a validation after
        it, an epoch's end: Lightning's first row of `log_every_n_steps=n` is at step n-1), and
        `global_step` before it runs (`before_step`: `on_train_batch_start`)."""
        step = self._loop.global_step
        return step if before_step or not self._fitting else max(step - 1, 0)

    def _log_step(self, *, before_step: bool) -> bool:
        """Whether the batch in progress is a log step (Lightning's `should_update_logs`)."""
        if before_step:  # the coming step
            return bool(self._every) and (self._loop.global_step + 1) % self._every == 0
        return self._loop.crossed(self._every)

    def _enqueue(self, row: _Row) -> None:
        """Writes `row` now, or after the windows on their way when some are (the loop writes
        those that have arrived after each step, `read_arrived`)."""
        if self._queue:
            self._queue.append(row)
        else:
            self._write_row(row)

    def _clear(self) -> None:
        self._queue.clear()
        self._windows = 0

    def _write_oldest(self, rate: float | None | types.EllipsisType = ...) -> None:
        """Writes the oldest row; a window is timed when read unless `rate` says its speed."""
        entry = self._queue.popleft()
        if isinstance(entry, _Row):
            self._write_row(entry)
        elif isinstance(entry, _EpochEnd):
            self._write_epoch_end(entry)
        else:
            self._windows -= 1
            self._write_window(*entry, rate=rate)

    def _timed(self, step: int) -> float | None:
        """Every step up to `step` has finished: their steps per second since the last time."""
        rate = self._rate.done(step=step)
        if rate is not None and self._on_timed is not None:
            self._on_timed(rate)
        return rate

    def _write_epoch_end(self, end: _EpochEnd) -> None:
        """Logs an epoch's means (every window of it written before); the next epoch's start
        from none if it started meanwhile (until then they stay the ended epoch's: Lightning's
        position after an epoch's end, which a save there holds)."""
        self._callback_metrics.update(self._step_values(end.latest))
        self._write_row(self._epoch_row(self._epoch.acc, end))
        if self._next_epoch:
            self._epoch, self._next_epoch = EpochAccumulators(), False

    def _epoch_row(self, acc: Mapping[str, np.ndarray], end: _EpochEnd) -> _Row:
        """The row of an epoch's means from its accumulators `acc`."""
        specs = self._specs
        values, pictures = _logged.compute_with_pictures(acc, specs, stage="train", epoch=True)
        return _Row(values, end.step, end.epoch, _logged.plain_names(acc, specs, epoch=True), pictures=pictures)

    def _step_values(self, latest: tuple[dict, HostMetrics | None] | None) -> HostMetrics:
        """An epoch's last step's values as `_EpochEnd.latest` holds them (read now if not yet)."""
        if latest is None:
            return {}
        outputs, values = latest
        return values if values is not None else self._on_step_values(outputs)

    def _write_row(self, row: _Row) -> None:
        if row.to_loggers:
            self._write(row.values, step=row.step, epoch=row.epoch, aliases=row.aliases, pictures=row.pictures)
        else:
            self._callback_metrics.update({**(row.aliases or {}), **row.values})

    def _write(self, values: HostMetrics, *, step: int, epoch: int, aliases: HostMetrics | None = None,
               pictures: Mapping[str, np.ndarray] | None = None) -> None:
        """Writes `values` to the loggers at `step` (with the compile times taken since the last
        row): the only call of `Logger.log_metrics` in fitjax outside the loggers."""
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
        self._logged_metrics.update({**values, **compiled})
        row = {**values, **compiled, "epoch": float(epoch)}
        with self._profiler.profile("[log] loggers"):
            for logger in self._loggers:
                logger.log_metrics(row, step=step)

    def _write_window(self, window: _log_fetch.Window, log_rows: bool, row: int, *,
                      rate: float | None | types.EllipsisType = ...) -> None:
        """Logs the means of a window (waits for it), at the row of the log step that started it;
        its steps are timed when it has been read, unless `rate` (`...`: not given) is their speed."""
        with self._profiler.profile("[sync] log step values"):  # waits for the device
            host, extra = window.read()
        if rate is ...:
            rate = self._timed(window.step)
        # merged even when empty: a resumed epoch's saved metric states take the window's structure
        self._epoch = self._epoch.merged(_logged.keep(host, self._specs, "on_epoch"))
        if not acc_lib.has_weight(host):
            return
        if not log_rows:
            return
        extra, values, aliases = self._window_rows_of(host, extra)
        self._write(extra, step=row, epoch=window.epoch)
        self.progress_bar_metrics.update(_logged.for_progress_bar(values, self._specs))
        self._write(values, aliases=aliases, step=row, epoch=window.epoch)
        self._on_window_logged(Position(window.epoch, window.batches_done, window.step), self.progress_bar_metrics,
                               rate)

    def _window_rows_of(self, host: dict, extra: dict) -> tuple[HostMetrics, HostMetrics, HostMetrics]:
        """A window's host values as its rows log them: the extra values, the on-step means and
        their plain names (Lightning's aliases)."""
        numbers = _logged.numbers(_logged.keep(host, self._specs, "on_step"))  # once for both
        return ({name: float(value) for name, value in extra.items()},
                _logged.keyed(numbers, self._specs, stage="train", epoch=False),
                _logged.plain_of(numbers, self._specs))

    def _pending(self) -> _Pending:
        """What `callback_metrics` and `logged_metrics` gain once the rows on
        their way are logged (waits for the windows; writes nothing: the loop logs them before
        its next write to the loggers). Follows `_write_oldest`'s order of updates."""
        pending = _Pending({}, {})
        epoch = self._epoch.acc
        ends = any(isinstance(entry, _EpochEnd) for entry in self._queue)  # else no means to compute
        for entry in self._queue:
            if isinstance(entry, _EpochEnd):
                pending.callback.update(self._step_values(entry.latest))
                entry = self._epoch_row(epoch, entry)
                epoch = {} if self._next_epoch else epoch
            if isinstance(entry, _Row):
                pending.callback.update({**(entry.aliases or {}), **entry.values})
                if entry.to_loggers:
                    pending.logged.update(entry.values)
                continue
            window, log_rows, _ = entry
            host, extra = window.read()
            if ends:
                epoch = acc_lib.merge_host(epoch, _logged.keep(host, self._specs, "on_epoch"))
            if log_rows and acc_lib.has_weight(host):
                extra, values, aliases = self._window_rows_of(host, extra)
                pending.callback.update({**extra, **aliases, **values})  # `_write`'s order of updates
                pending.logged.update({**extra, **values})
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
        values = self._on_step_values(outputs)
        self._latest_step_host = (outputs, values)
        return values

    def _on_step_values(self, outputs: dict) -> HostMetrics:
        """A train step's on-step values under their logged keys (waits for the step)."""
        host = jax.device_get({k: v for k, v in outputs.items() if k != step_lib.train.ANOMALY_KEY})
        acc = {k: np.array([v, 1.0]) for k, v in host.items() if np.ndim(v) == 0}
        on_step = _logged.keep(acc, self._specs, "on_step")
        return {**_logged.plain_names(on_step, self._specs, epoch=False),
                **_logged.compute(on_step, self._specs, stage="train", epoch=False)}
