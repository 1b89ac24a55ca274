"""`RichProgressBar`: epoch/step counters, speed, ETA and the latest fetched metrics.

It never blocks the device: it shows host counters and the metric values the trainer already
fetched at its last log step (`trainer.progress_bar_metrics`: the losses and the values logged
with `prog_bar=True`). When its stream is not a terminal (CI logs, `nohup`, SLURM files) it prints
one plain line per log step instead of redrawing with escape codes, when that step's values reach
the host (a step or two later: the trainer does not wait for them).

Every write happens on the training thread: the live bar is redrawn when the loop reports
progress (at most every 0.1 s), never from rich's refresh thread, so a line printed above the
bar cannot race a redraw that moves the cursor over it. The cost is that the elapsed time stands
still while one call blocks (a compilation, which the bar then names).
"""

from __future__ import annotations

import math
import sys
import time
from typing import Any, TextIO

import jax
from rich.console import Console
from rich.progress import Progress
from rich.text import Text

from fitjax import _logged, _status
from fitjax.callbacks._bar_rows import BarRows
from fitjax.callbacks._base import Callback, ignores_batch, ignores_outputs, plain_hook

_MIN_UPDATE_S = 0.1  # the live bar's redraw period (rich's default refresh rate)

__all__ = ["RichProgressBar"]


def _format(values: dict[str, float]) -> str:
    return "  ".join(f"{k} {v:.4g}" for k, v in values.items())


def _wrap(line: str, width: int) -> list[str]:
    """`line` in lines of at most `width` columns, broken only between its parts (separated by
    two spaces: `loss 0.1234` is one part), never inside one; the lines after the first indented.

    Example:
        >>> _wrap("Epoch 0 done in 1.0s  loss 0.25  acc 0.9", 30)
        ['Epoch 0 done in 1.0s', '  loss 0.25  acc 0.9']
    """
    lines: list[str] = []
    current = ""
    for part in line.split("  "):
        if not part:
            continue
        if current and len(current) + 2 + len(part) > width:
            lines.append(current)
            current = "  " + part
        else:
            current = f"{current}  {part}" if current else part
    return [*lines, current]


class _Bars(Progress):
    """rich's `Progress` (its tasks, clock and live display), its rows drawn by `BarRows` (rich's
    look at a quarter of its table's cost), with each task's values on lines of their own under
    the bars (wrapped between values): the bar's row keeps its counters and times whole at 80
    columns."""

    def restart(self, task_id, *, description: str, total: int | None, **fields: Any) -> None:
        """`reset` (completed 0, the clock from now, new fields) without its redraw (0.2-0.4 ms
        of CPU): the next update draws it."""
        with self._lock:
            task = self._tasks[task_id]
            task._reset()
            task.start_time, task.completed, task.total = self.get_time(), 0, total
            task.description, task.fields = description, fields

    def get_renderables(self):
        yield BarRows(self.tasks)
        for task in self.tasks:
            values = task.fields.get("metrics")
            if values:
                yield Text("\n".join(_wrap(values, self.console.width)), no_wrap=True, overflow="ignore")


def _speed(rate: float | None) -> str:
    """Optimizer steps per second as the loop measured them from finished steps (`rate`;
    `trainer.progress.steps_per_second`), or seconds per step below one."""
    if rate is None:
        return "- it/s"
    return f"{rate:.1f} it/s" if rate >= 1 else f"{1 / rate:.2f} s/it"


def _bar_values(trainer) -> dict[str, float]:
    """`train/` dropped from the keys: the bar is about training unless a key says otherwise."""
    return _without_train_prefix(trainer.progress_bar_metrics)


def _without_train_prefix(values: dict[str, float]) -> dict[str, float]:
    return {k.removeprefix("train/"): v for k, v in values.items()}


def _epoch_values(trainer, val_values: dict[str, float], eval_keys: set[str]) -> dict[str, float]:
    """The epoch means of training (`loss`, ...) and what the last validation logged.

    Train epoch means are `train/<name>_epoch` (shown as `<name>`), or `<name>_epoch` for a value
    a Lightning-style `training_step` logged on step and on epoch (shown as Lightning names it).
    """
    metrics = trainer.callback_metrics
    train = {k[len("train/"):-len("_epoch")]: v for k, v in metrics.items()
             if k.startswith("train/") and k.endswith("_epoch")}
    train.update({k: v for k, v in metrics.items()
                  if "/" not in k and k.endswith("_epoch") and k not in eval_keys})
    ordered = {"loss": train.pop("loss")} if "loss" in train else {}
    return {**ordered, **train, **val_values}


def _epoch_total(trainer, offset: int) -> int | None:
    """The batches this epoch will run: the epoch's, or fewer where `max_steps` ends it first
    (a 200-step run over 819-batch epochs counts to 200 x the accumulation, not to 819)."""
    total = trainer.num_training_batches
    max_steps = trainer.max_steps
    if max_steps is None or max_steps < 0:
        return total
    left = offset + max(0, max_steps - trainer.global_step) * trainer.accumulate_grad_batches
    return left if total is None else min(total, left)


def _eval_total(trainer, name: str, dataloader_idx: int) -> int | None:
    """The batches of a validation's loader (None: unknown, or a test)."""
    counts = trainer.num_val_batches if name != "Test" else []
    return counts[dataloader_idx] if dataloader_idx < len(counts) else None


def _results_lines(values: dict[str, float]) -> list[tuple[str, dict[str, float]]]:
    """`validate`/`test`'s results: one line, or one per loader as Lightning's table has one
    column per loader (its keys without the `/dataloader_idx_<i>` suffix)."""
    count = _logged.loader_count(values)
    if not count:
        return [("", values)]
    return [(f" (DataLoader {i})", _logged.of_loader(values, i, strip=True)) for i in range(count)]


def _logged_since(trainer, before: dict[str, float] | None) -> dict[str, float]:
    """The values of `trainer.callback_metrics` written since `before` was copied from it.

    A value written again is a new object even when its number is the same (validating the same
    weights twice), so identity tells which keys a stage logged, whatever their names.
    """
    before = before or {}
    return {k: v for k, v in trainer.callback_metrics.items() if before.get(k) is not v}


class RichProgressBar(Callback):
    """A progress bar for training and validation, with a summary line per finished epoch.

    Shows the epoch, step counters, it/s, elapsed time and ETA, the latest `train/loss` and every
    value logged with `self.log(..., prog_bar=True)`. Until the first train (validation, test)
    step returns it says "compiling train step" (validation, test): the first call of each step
    compiles it, which takes seconds. Validation gets its own bar; each finished epoch leaves
    one line with its mean train metrics and what the last validation logged (every value,
    whatever its name: `val/loss` or a Lightning-style `val_acc`). `validate` and `test` end
    with a line of every value they logged, as Lightning's results table does. With several
    processes only process 0 writes.

    Args:
        refresh_rate: redraw every this many steps. When the stream is not a terminal, a plain
            line is printed every `log_every_n_steps` steps (when new values arrive), or every
            `refresh_rate` steps if it is larger than 1.
        file: where to write (default stdout); a non-terminal stream gets plain lines.
        force_terminal: treat `file` as a terminal (True) or not (False); None detects it.
        console_kwargs: more arguments for the `rich.console.Console` it writes with (Lightning's
            name), e.g. `{"width": 120}` or `{"record": True}` to read back what was drawn with
            `bar.console.export_text()`.

    Example:
        >>> import io, fitjax as fj
        >>> bar = fj.RichProgressBar(refresh_rate=10, file=io.StringIO())
        >>> trainer = fj.Trainer(callbacks=[bar])
    """

    def __init__(self, refresh_rate: int = 1, *, file: TextIO | None = None,
                 force_terminal: bool | None = None, console_kwargs: dict[str, Any] | None = None):
        if not isinstance(refresh_rate, int) or isinstance(refresh_rate, bool) or refresh_rate < 1:
            raise ValueError(f"RichProgressBar(refresh_rate=...) must be a positive int, got {refresh_rate!r}")
        self.refresh_rate = refresh_rate
        self._file = file
        self._force_terminal = force_terminal
        self._console_kwargs = dict(console_kwargs or {})
        self._console: Console | None = None
        self._progress: _Bars | None = None
        self._train_task = None
        self._eval_task = None
        self._eval_description = ""
        self._eval_loader = 0  # the loader the evaluation bar counts (Lightning: a bar per loader)
        self._epoch_start = 0.0
        self._epoch_first_step = 0
        self._epoch_offset = 0
        self._epoch_batches: int | None = None  # the train epoch's batches (`num_training_batches`)
        self._seen_window = None  # the last log window's position this bar has looked at
        self._eval_logged_at: dict[str, int] = {}  # key -> the global step of the evaluation that logged it
        self._last_update = 0.0
        # The per-step hook returns at once before batch index `_quiet_until` while the clock is
        # before `_quiet_till`: the live bar's next redraw (the epoch's last batch, 0.1 s from the
        # last one), the plain lines' next possible line (no clock). -1 checks every step.
        self._quiet_until = -1
        self._quiet_till = 0.0
        self._printed_window = None
        self._stage = "fit"
        self._compiling: str | None = None  # the step whose first call is running, if any
        self._compiled: set[str] = set()  # steps whose first call returned in this run
        self._before: dict[str, float] | None = None  # callback_metrics when a stage started
        self._val_values: dict[str, float] = {}  # what the last validation logged
        self._eval_keys: set[str] = set()  # every key an evaluation logged in this run
        self._status = None  # the token of `_status.showing_on` between setup and teardown

    # ------------------------------------------------------------------------------ helpers

    @property
    def console(self) -> Console:
        """The `rich.console.Console` the bar writes with (made at first use)."""
        if self._console is None:
            # Only process 0 of a multi-host run draws; the others keep counting, silently.
            kwargs = {"file": self._file or sys.stdout, "force_terminal": self._force_terminal,
                      "quiet": jax.process_index() != 0, **self._console_kwargs}
            self._console = Console(**kwargs)
        return self._console

    @property
    def is_terminal(self) -> bool:
        return self.console.is_terminal

    def _print(self, line: str) -> None:
        """Prints `line`: on a terminal wrapped between its parts at its width (80 columns unless
        the terminal or `COLUMNS` says otherwise); piped or to a file, whole: one line a record,
        so that `grep Epoch` finds each epoch's values with it."""
        text = "\n".join(_wrap(line, self.console.width)) if self.is_terminal else line
        if self._progress is not None or self.console.record:
            # Above the live bar, drawn by this thread (no refresh thread runs: see the module doc)
            self.console.print(text, highlight=False, soft_wrap=True, markup=False)
        elif not self.console.quiet:  # a plain write: rich's print costs ~0.3 ms a line
            stream = self.console.file
            stream.write(text + "\n")
            stream.flush()

    def _start_progress(self) -> None:
        if self._progress is None and self.is_terminal:
            # the bar takes the room the counters leave; the values go on lines of their own
            self._progress = _Bars(console=self.console, transient=False, auto_refresh=False)
            self._progress.start()

    def _stop_progress(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
            self._train_task = self._eval_task = None

    def _close_train_bar(self, trainer) -> None:
        """The train batches are over (`_status.training_ended`): the bar is drawn at the batch
        it stopped at (between two clocked redraws a stop can come) and closed."""
        if self._progress is not None and self._train_task is not None and trainer.progress.batches_done:
            self._progress.update(self._train_task, completed=trainer.progress.batches_done)  # a paused epoch's
        self._stop_progress()

    def _compile_note(self, step: str) -> str:
        """"compiling <step> step" the first time `step` runs in this run (and remembers it)."""
        if step in self._compiled:
            return ""
        self._compiling = step
        return f"compiling {step} step"

    def _compiled_now(self) -> bool:
        """Called when a step returns: True the first time after `_compile_note` (a redraw is due)."""
        if self._compiling is None:
            return False
        self._compiled.add(self._compiling)
        self._compiling = None
        return True

    # ------------------------------------------------------------------------------ training

    def setup(self, trainer, module, stage: str) -> None:
        # the set-up's status lines (init, compilations) on this console, above the bar when drawn
        self._status = _status.showing_on(_status.Lines(self.console, live=lambda: self._progress is not None,
                                                        close=lambda: self._close_train_bar(trainer)))
        self._stage = stage
        self._compiled = set()  # each run builds (and compiles) its steps anew
        self._compiling = None
        self._val_values = {}

    def on_train_epoch_start(self, trainer, module) -> None:
        self._start_progress()
        self._epoch_start = time.perf_counter()
        self._epoch_first_step = trainer.global_step
        self._epoch_offset = trainer.progress.batches_done  # a resumed epoch's batches done before
        self._epoch_batches = _epoch_total(trainer, self._epoch_offset)
        note = self._compile_note("train")
        if self._progress is not None and not note:
            self._quiet_until_redraw()  # the last redraw was the previous epoch's
        else:  # the first step checks (it compiled); plain lines come at steps, not times
            self._quiet_until, self._quiet_till = -1, (0.0 if self._progress is not None else math.inf)
        if self._progress is not None:
            of = f"/{trainer.max_epochs - 1}" if trainer.max_epochs is not None else ""
            fields = dict(description=f"Epoch {trainer.current_epoch}{of}", total=self._epoch_batches,
                          speed="", eta="", metrics=note)
            if self._train_task is None:
                self._train_task = self._progress.add_task(**fields)
            else:  # the same bar, emptied (a new task would cost a redraw)
                self._progress.restart(self._train_task, **fields)
            if note:  # drawn now: the first step may block for seconds compiling
                self._progress.refresh()
            # else the epoch's first clocked update draws it, within `_MIN_UPDATE_S`
        elif note:
            self._print(note)

    @plain_hook  # logs nothing, calls no model: called directly at every step
    @ignores_outputs
    @ignores_batch
    def on_train_batch_end(self, trainer, module, outputs: Any, batch: Any, batch_idx: int) -> None:
        # Runs every step (on the tiny MLP's ~85 µs step each µs here is 1.2% of it): between two
        # redraws of the live bar it only reads the clock.
        if batch_idx < self._quiet_until and time.perf_counter() < self._quiet_till:
            return
        self._batch_ended(trainer, batch_idx)

    def _batch_ended(self, trainer, batch_idx: int) -> None:
        """`on_train_batch_end` when a redraw or a printed line may be due."""
        done = batch_idx + 1
        now = time.perf_counter()
        compiled = self._compiling is not None and self._compiled_now()
        if self._progress is not None:
            # Feeding rich more often than ~10 Hz only costs the training loop time, so updates
            # are limited by the clock; the epoch's last batch is always drawn.
            last = done == self._epoch_batches
            if compiled or last or (now - self._last_update >= _MIN_UPDATE_S
                                    and trainer.progress.crossed_batches(self.refresh_rate)):
                self._last_update = now
                self._quiet_until_redraw()
                rate = trainer.progress.steps_per_second
                # The epoch's last batch is drawn by what follows it at once: the epoch's line
                # printed above the bar, or the validation bar's first draw.
                self._progress.update(self._train_task, completed=done, speed=_speed(rate),
                                      eta=self._eta(trainer, done, rate),
                                      metrics=_format(_bar_values(trainer)), refresh=compiled or not last)
            return
        if self.refresh_rate > 1:
            if trainer.progress.crossed(self.refresh_rate):  # several steps per call included
                self._print_line(trainer, trainer.current_epoch, done, trainer.global_step)
                self._quiet_until = batch_idx + self.refresh_rate  # the next multiple: as many steps on
        elif trainer.progress.last_logged is not self._seen_window:  # a window reached the loggers
            self._print_window(trainer)
            self._quiet_until = self._next_window_batch(trainer)

    def _quiet_until_redraw(self) -> None:
        """The per-step hook returns at once until the live bar's next redraw is due: 0.1 s
        after the last one, or the epoch's last batch (an epoch of unknown length: every step)."""
        if self._epoch_batches is None:
            self._quiet_until, self._quiet_till = -1, 0.0
        else:
            self._quiet_until, self._quiet_till = self._epoch_batches - 1, self._last_update + _MIN_UPDATE_S

    def _next_window_batch(self, trainer) -> int:
        """The first batch index at which a log window after the last printed one can reach the
        host: its log step is `log_every_n_steps` optimizer steps (at least as many batches) after
        the printed window's (-1, every step, when that window is not of this epoch)."""
        printed, every = self._printed_window, trainer.log_every_n_steps
        if printed is None or not every or printed.epoch != trainer.current_epoch:
            return -1
        return printed.batches_done - 1 + every

    def _eta(self, trainer, done: int, rate: float | None) -> str:
        """The epoch's time left at `rate` steps per second ("-:--:--" until measured)."""
        total, steps, batches = self._epoch_batches, trainer.global_step - self._epoch_first_step, done - self._epoch_offset
        if rate is None or total is None or not steps or batches <= 0:
            return "-:--:--"
        left = round((total - done) * steps / batches / rate)
        return f"{left // 3600}:{left // 60 % 60:02d}:{left % 60:02d}"

    def _print_window(self, trainer) -> None:
        """A line for each log window not printed yet, once its values have reached the host (a
        step or two after its log step: the trainer does not wait for them, so several can arrive
        at once), each with the values it logged."""
        self._seen_window = trainer.progress.last_logged
        for position, values, rate in trainer.progress.recent_logged:
            if self._printed_window is None or position.step > self._printed_window.step:
                self._printed_window = position
                self._print_line(trainer, position.epoch, position.batches_done, position.step,
                                 bar_values=values, rate=rate)

    def _print_line(self, trainer, epoch: int, done: int, step: int,
                    bar_values: dict[str, float] | None = None, rate: float | None = None) -> None:
        """A plain line: where the run stands, the speed (`rate`: the window's; the latest
        measured when not given) and the bar's values."""
        total = self._epoch_batches
        of = f"/{total}" if total is not None else ""
        shown = _bar_values(trainer) if bar_values is None else _without_train_prefix(bar_values)
        # an evaluation that ran at or after this line's step had not run when the step did
        values = {k: v for k, v in shown.items() if self._eval_logged_at.get(k, -1) < step}
        speed = _speed(trainer.progress.steps_per_second if rate is None else rate)
        self._print(f"epoch {epoch} batch {done}{of} (optimizer step {step})  {speed}  {_format(values)}")

    def on_train_epoch_end(self, trainer, module) -> None:
        elapsed = time.perf_counter() - self._epoch_start
        if self._progress is None and self.refresh_rate == 1:
            self._print_window(trainer)  # the epoch's last window, logged at its end
        values = _epoch_values(trainer, self._val_values, self._eval_keys)
        total = trainer.num_training_batches
        max_steps = trainer.max_steps
        done = trainer.progress.batches_done
        if max_steps is not None and 0 < max_steps <= trainer.global_step and total and done < total:
            ended = f"stopped at max_steps={max_steps} after {done}/{total} batches"
        else:
            ended = "done"
        self._print(f"Epoch {trainer.current_epoch} {ended} in {elapsed:.1f}s (optimizer step "
                    f"{trainer.global_step})  {_format(values)}")

    # ---------------------------------------------------------------------------- evaluation

    def _eval_start(self, trainer, name: str, step: str) -> None:
        self._before = dict(trainer.callback_metrics)
        note = self._compile_note(step)
        self._eval_description, self._eval_loader = name, 0
        if not self.is_terminal:
            return
        self._start_progress()
        self._eval_task = self._progress.add_task(name, total=_eval_total(trainer, name, 0), speed="", eta="",
                                                  metrics=note)
        self._progress.refresh()  # drawn before the first batch, which may compile for seconds

    def _eval_batch(self, trainer, batch_idx: int, name: str, dataloader_idx: int) -> None:
        compiled = self._compiled_now()
        if self._progress is None or self._eval_task is None:
            return
        now = time.perf_counter()
        if dataloader_idx != self._eval_loader:  # the next loader: a bar of its own, as Lightning
            self._eval_loader = dataloader_idx
            self._progress.remove_task(self._eval_task)
            self._eval_task = self._progress.add_task(self._eval_description, speed="", eta="", metrics="",
                                                      total=_eval_total(trainer, name, dataloader_idx))
            compiled = True  # drawn at once
        if compiled or now - self._last_update >= _MIN_UPDATE_S:
            self._last_update = now
            total = _eval_total(trainer, name, dataloader_idx)  # known once it runs
            self._progress.update(self._eval_task, completed=batch_idx + 1, total=total, metrics="",
                                  refresh=True)

    def _eval_end(self, trainer, name: str) -> None:
        values = _logged_since(trainer, self._before)
        self._eval_keys.update(values)
        self._eval_logged_at.update(dict.fromkeys(values, trainer.global_step))
        self._remove_eval_task()
        if self._progress is not None and self._train_task is not None:
            # the validation's prog_bar values, shown at once
            self._progress.update(self._train_task, metrics=_format(_bar_values(trainer)), refresh=True)
        if self._stage == "fit":  # fit shows validation in the epoch line instead
            self._val_values = values
        else:
            if trainer.stage.verbose:  # validate/test(verbose=False): no line
                for title, shown in _results_lines(values):
                    self._print(f"{name} results{title}  {_format(shown)}")
            self._stop_progress()

    def _remove_eval_task(self) -> None:
        if self._progress is not None and self._eval_task is not None:
            self._progress.remove_task(self._eval_task)
            self._eval_task = None
            self._progress.refresh()

    def on_validation_start(self, trainer, module) -> None:
        # Lightning's name for the few validation batches run before training
        name = "Sanity Checking" if trainer.sanity_checking else "Validation"
        self._eval_start(trainer, name, "validation")

    @ignores_outputs
    def on_validation_batch_end(self, trainer, module, outputs: Any, batch: Any, batch_idx: int,
                                dataloader_idx: int = 0) -> None:
        self._eval_batch(trainer, batch_idx, "Validation", dataloader_idx)

    def on_validation_end(self, trainer, module) -> None:
        if not trainer.sanity_checking:  # a sanity check's values are not results
            self._eval_end(trainer, "Validation")
        else:
            self._remove_eval_task()

    def on_test_start(self, trainer, module) -> None:
        self._eval_start(trainer, "Test", "test")

    @ignores_outputs
    def on_test_batch_end(self, trainer, module, outputs: Any, batch: Any, batch_idx: int,
                          dataloader_idx: int = 0) -> None:
        self._eval_batch(trainer, batch_idx, "Test", dataloader_idx)

    def on_test_end(self, trainer, module) -> None:
        self._eval_end(trainer, "Test")

    # ------------------------------------------------------------------------------ endings

    def on_fit_end(self, trainer, module) -> None:
        self._stop_progress()
        # Lightning's closing line (its fit loop logs it at info level)
        if trainer.max_steps is not None and 0 < trainer.max_steps <= trainer.global_step:
            self._print(f"`Trainer.fit` stopped: `max_steps={trainer.max_steps}` reached.")
        elif trainer.max_epochs is not None and trainer.current_epoch >= trainer.max_epochs:
            self._print(f"`Trainer.fit` stopped: `max_epochs={trainer.max_epochs}` reached.")

    def on_exception(self, trainer, module, exception: BaseException) -> None:
        self._stop_progress()

    def teardown(self, trainer, module, stage: str) -> None:
        self._stop_progress()
        if self._status is not None:
            _status.stop_showing(self._status)
            self._status = None
