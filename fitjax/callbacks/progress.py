"""`RichProgressBar`: epoch/step counters, speed, ETA and the latest fetched metrics.

It never blocks the device: it shows host counters and the metric values the trainer already
fetched at its last log step. When stdout is not a terminal (CI logs, `nohup`, SLURM files) it
prints one plain line every `refresh_rate` steps instead of redrawing with escape codes.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

import jax
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from fitjax.callbacks._base import Callback

__all__ = ["RichProgressBar"]


def _format_metrics(values: dict[str, float]) -> str:
    return "  ".join(f"{k} {v:.4g}" for k, v in values.items())


class RichProgressBar(Callback):
    """A progress bar for training and validation, with a summary line per finished epoch.

    With several processes only process 0 writes.

    Args:
        refresh_rate: redraw every this many steps (plain lines: print every this many steps;
            default 50 when not a terminal).
        file: where to write (default stdout); a non-terminal stream gets plain lines.

    Example:
        >>> import fitjax as fj
        >>> trainer = fj.Trainer(callbacks=[fj.RichProgressBar(refresh_rate=10)])
    """

    def __init__(self, refresh_rate: int = 1, *, file: TextIO | None = None):
        if not isinstance(refresh_rate, int) or refresh_rate < 1:
            raise ValueError(f"RichProgressBar(refresh_rate=...) must be a positive int, got {refresh_rate!r}")
        self.refresh_rate = refresh_rate
        self._file = file
        self._console: Console | None = None
        self._progress: Progress | None = None
        self._train_task = None
        self._val_task = None
        self._epoch_start = 0.0
        self._plain_every = refresh_rate

    # ------------------------------------------------------------------------------ helpers

    @property
    def is_terminal(self) -> bool:
        return self._get_console().is_terminal

    def _get_console(self) -> Console:
        if self._console is None:
            # Only process 0 of a multi-host run draws; the others keep counting, silently.
            self._console = Console(file=self._file or sys.stdout, quiet=jax.process_index() != 0)
            if not self._console.is_terminal and self.refresh_rate == 1:
                self._plain_every = 50
        return self._console

    def _shown_metrics(self, trainer) -> dict[str, float]:
        return {k: v for k, v in trainer.progress_bar_metrics.items()}

    def _start_progress(self) -> None:
        if self._progress is None and self.is_terminal:
            self._progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                TextColumn("{task.fields[speed]}"),
                TextColumn("{task.fields[metrics]}"),
                console=self._console,
                transient=False,
            )
            self._progress.start()

    def _stop_progress(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    # -------------------------------------------------------------------------------- hooks

    def on_train_epoch_start(self, trainer, module) -> None:
        self._get_console()
        self._start_progress()
        self._epoch_start = time.perf_counter()
        self._epoch_first_step = trainer.global_step
        if self._progress is not None:
            if self._train_task is not None:
                self._progress.remove_task(self._train_task)
            self._train_task = self._progress.add_task(
                f"Epoch {trainer.current_epoch}", total=trainer.num_training_batches, speed="", metrics=""
            )

    def on_train_batch_end(self, trainer, module, outputs: Any, batch: Any, batch_idx: int) -> None:
        done = batch_idx + 1
        if self._progress is not None:
            if done % self.refresh_rate == 0 or done == trainer.num_training_batches:
                elapsed = max(time.perf_counter() - self._epoch_start, 1e-9)
                speed = (trainer.global_step - self._epoch_first_step) / elapsed
                self._progress.update(
                    self._train_task, completed=done, speed=f"{speed:.1f} it/s",
                    metrics=_format_metrics(self._shown_metrics(trainer)),
                )
        elif done % self._plain_every == 0:
            total = trainer.num_training_batches
            of = f"/{total}" if total is not None else ""
            self._console.print(
                f"epoch {trainer.current_epoch} step {done}{of} (global {trainer.global_step})  "
                f"{_format_metrics(self._shown_metrics(trainer))}",
                highlight=False, soft_wrap=True,
            )

    def on_validation_start(self, trainer, module) -> None:
        if self._progress is not None and trainer.num_val_batches:
            self._val_task = self._progress.add_task(
                "Validation", total=trainer.num_val_batches, speed="", metrics=""
            )

    def on_validation_batch_end(self, trainer, module, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self._progress is not None and self._val_task is not None:
            self._progress.update(self._val_task, completed=batch_idx + 1)

    def on_validation_end(self, trainer, module) -> None:
        if self._progress is not None and self._val_task is not None:
            self._progress.remove_task(self._val_task)
            self._val_task = None

    def on_train_epoch_end(self, trainer, module) -> None:
        elapsed = time.perf_counter() - self._epoch_start
        shown = {k: v for k, v in trainer.callback_metrics.items() if k.endswith("_epoch") or k.startswith("val/")}
        line = f"Epoch {trainer.current_epoch} done in {elapsed:.1f}s  {_format_metrics(shown)}"
        if self._progress is not None:
            self._progress.console.print(line, highlight=False)
        else:
            self._console.print(line, highlight=False, soft_wrap=True)

    def on_fit_end(self, trainer, module) -> None:
        self._stop_progress()

    def on_exception(self, trainer, module, exception: BaseException) -> None:
        self._stop_progress()

    def teardown(self, trainer, module, stage: str) -> None:
        self._stop_progress()
