"""Where the loop's values go: the loggers, `callback_metrics` and the progress bar's values.

`Logs` is a part of `Trainer` (it reads the trainer's loggers, profiler and progress); it lives
here so that `trainer.py` reads as the fit loop's outline. The train values reach the host in
windows (`fitjax._log_fetch`): one is started at a log step and read at a later step, once it has
arrived, so the loop never waits for the device to log.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from fitjax import _log_fetch, _logged
from fitjax import step as step_lib
from fitjax import metrics as acc_lib
from fitjax._typing import HostMetrics
from fitjax.loop.progress import Position
from fitjax.module import LitModule

__all__ = ["Logs"]

_IN_FLIGHT = 4  # log windows on their way to the host at most (each holds a few scalars)


class Logs:
    """The logging part of `Trainer`: logged values, hook calls that log, the train windows."""

    def _log(self, values: HostMetrics, *, step: int | None = None, epoch: int | None = None,
             aliases: HostMetrics | None = None) -> None:
        """Records `values` as the latest and writes them to the loggers at `step`; `aliases`
        (Lightning's plain names of forked values) go to `callback_metrics` only.

        The default step is Lightning's: during fit the index of the last step taken
        (`global_step - 1`), else `global_step`."""
        while self._windows and self._windows[0][0].was_read:  # read by `callback_metrics`:
            self._read_oldest_window()  # its rows first, so the loggers get rows in step order
        self._write(values, step=step, epoch=epoch, aliases=aliases)

    def _write(self, values: HostMetrics, *, step: int | None = None, epoch: int | None = None,
               aliases: HostMetrics | None = None) -> None:
        """`_log` without logging the read windows first (a window's own rows)."""
        if aliases:
            self._callback_metrics.update(aliases)
        compiled = self._compile_times.take()  # compile/<program>_s: for the loggers, not the callbacks
        if not values and not compiled:
            return
        self._callback_metrics.update(values)
        self.logged_metrics.update({**values, **compiled})
        if step is None:
            step = max(self.global_step - 1, 0) if self._stage.name == "fit" else self.global_step
        row = {**values, **compiled, "epoch": float(self.current_epoch if epoch is None else epoch)}
        with self.profiler.profile("[log] loggers"):
            for logger in self.loggers:
                logger.log_metrics(row, step=step)

    def _call(self, hook: str, module: LitModule, *args: Any, log: bool = True) -> None:
        """Calls `hook` on the module and the callbacks; logs what the module's hook passed to
        `self.log` (host values, under the names given), unless `log` is False (sanity check)."""
        logged = self._hooks.call(hook, self, module, *args)
        if logged and log:
            values = _logged.host_values(logged, owner=type(module).__name__, hook=hook)
            self.progress_bar_metrics.update({k: values[k] for k in logged.specs if logged.specs[k].prog_bar})
            self._log(values)

    def _start_train_window(self, *, log_rows: bool = True) -> None:
        """Starts fetching the accumulators (reset on device) for `_finish_train_window`;
        `log_rows=False`: they only join the epoch's means (the end of an epoch).

        The windows before it stay on their way until they have arrived (`_read_arrived_windows`),
        at most `_IN_FLIGHT` of them: reading one that has not arrived makes the host wait for
        the device and then wake up, and on a loaded machine that wake-up can leave the device
        idle for longer than the step (several steps per call put a log step in most calls)."""
        self._read_arrived_windows()
        while len(self._windows) >= _IN_FLIGHT:
            self._read_oldest_window()
        self._run.state, window = _log_fetch.start(self._run.state, self._compiled.reset_metrics, step=self.global_step,
                                              epoch=self.current_epoch, batches_done=self._progress.batches_done)
        self._windows.append((window, log_rows))

    def _read_arrived_windows(self) -> None:
        """Logs the windows whose values have reached the host, oldest first (never waits)."""
        while self._windows and self._windows[0][0].ready():
            self._read_oldest_window()

    def _finish_train_window(self) -> None:
        """Logs every window on its way, oldest first, each at the step it ended (waits for them)."""
        while self._windows:
            self._read_oldest_window()

    def _read_oldest_window(self) -> None:
        """Logs the means of the oldest window on its way (waits for it).

        Rows are written at step `global_step - 1` of the step that ended the window, as
        Lightning does (its first row of `log_every_n_steps=n` is at step n-1)."""
        window, log_rows = self._windows.popleft()
        with self.profiler.profile("[sync] log step values"):  # waits for the device
            host, extra = window.read()
        if not any(w > 0 for _, w in host.values()):
            return
        specs = self._compiled.log_specs
        self._epoch_acc = acc_lib.merge_host(self._epoch_acc, _logged.keep(host, specs, "on_epoch"))
        if not log_rows:
            return
        at = {"step": window.step - 1, "epoch": window.epoch}
        extra, values, aliases = self._window_rows_of(host, extra)
        self._write(extra, **at)
        self.progress_bar_metrics.update(_logged.for_progress_bar(values, specs))
        self._write(values, aliases=aliases, **at)
        self._progress.logged(Position(window.epoch, window.batches_done, window.step), self.progress_bar_metrics)

    def _window_rows_of(self, host: dict, extra: dict) -> tuple[HostMetrics, HostMetrics, HostMetrics]:
        """A window's host values as its rows log them: the extra values, the on-step means and
        their plain names (Lightning's aliases)."""
        specs = self._compiled.log_specs
        on_step = _logged.keep(host, specs, "on_step")
        return ({name: float(value) for name, value in extra.items()},
                _logged.compute(on_step, specs, stage="train", epoch=False),
                _logged.plain_names(on_step, specs, epoch=False))

    def _pending_callback_metrics(self) -> HostMetrics:
        """What `callback_metrics` holds once the windows on their way are logged (waits for
        them; writes nothing: the loop logs them before its next write to the loggers)."""
        pending: HostMetrics = {}
        for window, log_rows in self._windows:
            host, extra = window.read()
            if log_rows and any(w > 0 for _, w in host.values()):
                extra, values, aliases = self._window_rows_of(host, extra)
                pending.update({**extra, **aliases, **values})  # `_write`'s order of updates
        return pending

    def _latest_step_metrics(self) -> HostMetrics:
        """The last train step's on-step values under their logged keys (Lightning's
        `callback_metrics` after every step); read from the device now, once per step, only
        when someone asks (`callback_metrics`). The loop only keeps a reference per step."""
        outputs = self._latest_step
        if outputs is None:
            return {}
        cached = self._latest_step_host
        if cached is not None and cached[0] is outputs:
            return cached[1]
        host = jax.device_get({k: v for k, v in outputs.items() if k != step_lib.train.ANOMALY_KEY})
        acc = {k: np.array([v, 1.0]) for k, v in host.items() if np.ndim(v) == 0}
        specs = self._compiled.log_specs
        on_step = _logged.keep(acc, specs, "on_step")
        values = {**_logged.plain_names(on_step, specs, epoch=False),
                  **_logged.compute(on_step, specs, stage="train", epoch=False)}
        self._latest_step_host = (outputs, values)
        return values

    def _fold_latest_step(self) -> None:
        """The last step's values join `callback_metrics` for good (before the epoch's means,
        which Lightning writes over the plain names of values logged on step and on epoch)."""
        if self._latest_step is not None:
            self._callback_metrics.update(self._latest_step_metrics())
        self._latest_step = self._latest_step_host = None

    def _log_train_epoch(self) -> None:
        """Logs the train epoch's means: the windows read so far and the steps since the last log step."""
        self._finish_train_window()
        self._start_train_window(log_rows=False)  # the steps since the last log step
        self._finish_train_window()
        self._fold_latest_step()  # newer than the windows, older than the epoch's means
        specs = self._compiled.log_specs
        self._log(_logged.compute(self._epoch_acc, specs, stage="train", epoch=True),
                  aliases=_logged.plain_names(self._epoch_acc, specs, epoch=True))

    def _finalize_loggers(self, status: str) -> None:
        for logger in self.loggers:
            logger.finalize(status)
