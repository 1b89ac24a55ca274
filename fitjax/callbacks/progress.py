"""`RichProgressBar`: epoch/step counters, speed, ETA and the latest fetched metrics.

It never blocks the device: it shows host counters and the metric values the trainer already
fetched at its last log step (`trainer.progress_bar_metrics`: the losses and the values logged
with `prog_bar=True`). When its stream is not a terminal (CI logs, `nohup`, SLURM files) it prints
one plain line per log step instead of redrawing with escape codes, when that step's values reach
the host (a step or two later: the trainer does not wait for them).
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

import jax
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from fitjax.callbacks._base import Callback, ignores_batch

_MIN_UPDATE_S = 0.1  # the live bar's redraw period (rich's default refresh rate)

__all__ = ["RichProgressBar"]


def _format(values: dict[str, float]) -> str:
    return "  ".join(f"{k} {v:.4g}" for k, v in values.items())


def _bar_values(trainer) -> dict[str, float]:
    """`train/` dropped from the keys: the bar is about training unless a key says otherwise."""
    return {k.removeprefix("train/"): v for k, v in trainer.progress_bar_metrics.items()}


def _epoch_values(trainer) -> dict[str, float]:
    """The epoch means of training (`loss`, ...) and the latest validation values."""
    metrics = trainer.callback_metrics
    train = {k[len("train/"):-len("_epoch")]: v for k, v in metrics.items()
             if k.startswith("train/") and k.endswith("_epoch")}
    ordered = {"loss": train.pop("loss")} if "loss" in train else {}
    return {**ordered, **train, **{k: v for k, v in metrics.items() if k.startswith("val/")}}


class RichProgressBar(Callback):
    """A progress bar for training and validation, with a summary line per finished epoch.

    Shows the epoch, step counters, it/s, elapsed time and ETA, the latest `train/loss` and every
    value logged with `self.log(..., prog_bar=True)`. Validation gets its own bar; each finished
    epoch leaves one line with its mean train metrics and validation results. With several
    processes only process 0 writes.

    Args:
        refresh_rate: redraw every this many steps. When the stream is not a terminal, a plain
            line is printed every `log_every_n_steps` steps (when new values arrive), or every
            `refresh_rate` steps if it is larger than 1.
        file: where to write (default stdout); a non-terminal stream gets plain lines.
        force_terminal: treat `file` as a terminal (True) or not (False); None detects it.

    Example:
        >>> import io, fitjax as fj
        >>> bar = fj.RichProgressBar(refresh_rate=10, file=io.StringIO())
        >>> trainer = fj.Trainer(callbacks=[bar])
    """

    def __init__(self, refresh_rate: int = 1, *, file: TextIO | None = None,
                 force_terminal: bool | None = None):
        if not isinstance(refresh_rate, int) or isinstance(refresh_rate, bool) or refresh_rate < 1:
            raise ValueError(f"RichProgressBar(refresh_rate=...) must be a positive int, got {refresh_rate!r}")
        self.refresh_rate = refresh_rate
        self._file = file
        self._force_terminal = force_terminal
        self._console: Console | None = None
        self._progress: Progress | None = None
        self._train_task = None
        self._eval_task = None
        self._epoch_start = 0.0
        self._epoch_first_step = 0
        self._stage = "fit"

    # ------------------------------------------------------------------------------ helpers

    @property
    def console(self) -> Console:
        if self._console is None:
            # Only process 0 of a multi-host run draws; the others keep counting, silently.
            self._console = Console(file=self._file or sys.stdout, force_terminal=self._force_terminal,
                                    quiet=jax.process_index() != 0)
            if not self._console.is_terminal:
                self._console.width = max(self._console.width, 160)  # logs have no width: never wrap
        return self._console

    @property
    def is_terminal(self) -> bool:
        return self.console.is_terminal

    def _print(self, line: str) -> None:
        if self._progress is not None:
            self._progress.console.print(line, highlight=False, soft_wrap=True, markup=False)
        elif not self.console.quiet:  # a plain write: rich's print costs ~0.3 ms a line
            stream = self._file or sys.stdout
            stream.write(line + "\n")
            stream.flush()

    def _start_progress(self) -> None:
        if self._progress is None and self.is_terminal:
            self._progress = Progress(
                TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                TimeElapsedColumn(), TimeRemainingColumn(), TextColumn("{task.fields[speed]}"),
                TextColumn("{task.fields[metrics]}"),
                console=self.console, transient=False,
            )
            self._progress.start()

    def _stop_progress(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
            self._train_task = self._eval_task = None

    # ------------------------------------------------------------------------------ training

    def setup(self, trainer, module, stage: str) -> None:
        self._stage = stage

    def on_train_epoch_start(self, trainer, module) -> None:
        self._start_progress()
        self._epoch_start = time.perf_counter()
        self._epoch_first_step = trainer.global_step
        if self._progress is not None:
            if self._train_task is not None:
                self._progress.remove_task(self._train_task)
            of = f"/{trainer.max_epochs - 1}" if trainer.max_epochs is not None else ""
            self._train_task = self._progress.add_task(
                f"Epoch {trainer.current_epoch}{of}", total=trainer.num_training_batches, speed="", metrics=""
            )

    @ignores_batch
    def on_train_batch_end(self, trainer, module, outputs: Any, batch: Any, batch_idx: int) -> None:
        done = batch_idx + 1
        if self._progress is not None:
            # rich redraws at 10 Hz by itself: feeding it more often than that only costs the
            # training loop time (~30 µs an update), so updates are also limited by the clock.
            now = time.perf_counter()
            last = done == trainer.num_training_batches
            if last or (done % self.refresh_rate == 0 and now - self._last_update >= _MIN_UPDATE_S):
                self._last_update = now
                self._progress.update(self._train_task, completed=done, speed=self._speed(trainer),
                                      metrics=_format(_bar_values(trainer)))
            return
        if self.refresh_rate > 1:
            if trainer.global_step % self.refresh_rate == 0:
                self._print_line(trainer, trainer.current_epoch, done, trainer.global_step)
        else:
            self._print_window(trainer)

    _last_update = 0.0
    _printed_window = None

    def _print_window(self, trainer) -> None:
        """A line for the last log window, once its values have reached the host (a step or two
        after its log step: the trainer does not wait for them)."""
        window = trainer.progress.last_logged
        if window is not None and window != self._printed_window:
            self._printed_window = window
            self._print_line(trainer, window.epoch, window.batches_done, window.step)

    def _print_line(self, trainer, epoch: int, done: int, step: int) -> None:
        total = trainer.num_training_batches
        of = f"/{total}" if total is not None else ""
        self._print(f"epoch {epoch} step {done}{of} (global {step})  "
                    f"{self._speed(trainer)}  {_format(_bar_values(trainer))}")

    def _speed(self, trainer) -> str:
        elapsed = max(time.perf_counter() - self._epoch_start, 1e-9)
        return f"{(trainer.global_step - self._epoch_first_step) / elapsed:.1f} it/s"

    def on_train_epoch_end(self, trainer, module) -> None:
        elapsed = time.perf_counter() - self._epoch_start
        if self._progress is None and self.refresh_rate == 1:
            self._print_window(trainer)  # the epoch's last window, logged at its end
        self._print(f"Epoch {trainer.current_epoch} done in {elapsed:.1f}s (global step "
                    f"{trainer.global_step})  {_format(_epoch_values(trainer))}")

    # ---------------------------------------------------------------------------- evaluation

    def _eval_batch(self, trainer, batch_idx: int, name: str) -> None:
        if not self.is_terminal:
            return
        self._start_progress()
        if self._eval_task is None:  # created here: the batch count is known once the stage runs
            total = trainer.num_val_batches if name == "Validation" else None
            self._eval_task = self._progress.add_task(name, total=total, speed="", metrics="")
        self._progress.update(self._eval_task, completed=batch_idx + 1)

    def _eval_end(self, trainer, prefix: str) -> None:
        if self._progress is not None and self._eval_task is not None:
            self._progress.remove_task(self._eval_task)
            self._eval_task = None
        if self._stage != "fit":  # fit shows validation in the epoch line instead
            results = {k: v for k, v in trainer.callback_metrics.items() if k.startswith(prefix)}
            self._print(f"{'Validation' if prefix == 'val/' else 'Test'} results  {_format(results)}")
            self._stop_progress()

    def on_validation_batch_end(self, trainer, module, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._eval_batch(trainer, batch_idx, "Validation")

    def on_validation_end(self, trainer, module) -> None:
        self._eval_end(trainer, "val/")

    def on_test_batch_end(self, trainer, module, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._eval_batch(trainer, batch_idx, "Test")

    def on_test_end(self, trainer, module) -> None:
        self._eval_end(trainer, "test/")

    # ------------------------------------------------------------------------------ endings

    def on_fit_end(self, trainer, module) -> None:
        self._stop_progress()

    def on_exception(self, trainer, module, exception: BaseException) -> None:
        self._stop_progress()

    def teardown(self, trainer, module, stage: str) -> None:
        self._stop_progress()
