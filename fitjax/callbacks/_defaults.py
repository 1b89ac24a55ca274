"""The callbacks a `Trainer` adds by itself (progress bar, model summary, checkpoint), unless told not to."""

from __future__ import annotations

import time
from typing import Iterable

from fitjax import checkpoint
from fitjax.callbacks._base import Callback
from fitjax.callbacks.model_checkpoint import ModelCheckpoint
from fitjax.callbacks.progress import RichProgressBar
from fitjax.callbacks.summary import RichModelSummary
from fitjax.step import xla_cpu

__all__ = ["DefaultCheckpoint", "with_defaults"]

SAVE_SHARE = 0.02  # the default checkpoint's saves take at most this share of the fit's time


def with_defaults(callbacks: Iterable[Callback] | None, *, progress_bar: bool, model_summary: bool
                  ) -> list[Callback]:
    """The user's callbacks plus a default of each enabled kind they did not supply themselves;
    a disabled kind is removed even when supplied (Lightning's `enable_*` flags win)."""
    callbacks = list(callbacks or [])
    for cb in callbacks:
        if not isinstance(cb, Callback):
            raise TypeError(
                f"Trainer(callbacks=...) items must be fitjax.Callback instances, got "
                f"{type(cb).__name__}: {cb!r}"
            )
    for enabled, kind in ((model_summary, RichModelSummary), (progress_bar, RichProgressBar)):
        if not enabled:
            callbacks = [cb for cb in callbacks if not isinstance(cb, kind)]
        elif not any(isinstance(cb, kind) for cb in callbacks):
            callbacks.append(kind())
    return callbacks


class DefaultCheckpoint(ModelCheckpoint):
    """The checkpoint a `Trainer` adds when none is configured (`enable_checkpointing=True`).

    Lightning's default `ModelCheckpoint()` saves at every epoch's end and keeps the newest, so
    a finished fit leaves the last epoch's state on disk. This one leaves the same checkpoint
    (same folder, same `epoch=E-step=S` name, the same state), but an epoch-end save is skipped
    when it would take saving over `share` of the fit's time so far, measured from its own
    saves: one Orbax save costs ~30 ms of CPU whatever the state's size, which was 0.64x of a
    hand-written loop's speed on 0.12 s epochs. What a skip leaves out is caught up:

    - at the end of training, the last epoch's state is saved if its epoch end was skipped;
    - on SIGTERM, on Ctrl-C after a step, and on an exception after a skipped epoch end, the
      state where fit stopped is saved (with the data position: `ckpt_path="last"` resumes from
      there exactly).

    What a save costs the loop depends on where the step runs (`xla_cpu.saves_compete_with_the_step`):
    on CPU each save is waited for, so its measured time is the time the loop lost to it (on 2
    CPU cores a save in the background cost the loop ~75 ms, more than the save itself). On an
    accelerator the loop goes on once the state is copied (within the devices' memory where they
    have room, `fitjax.checkpoint.CheckpointWriter`) and the files are written beside it; an
    epoch end reached while the previous save is still being written is skipped like one over
    budget (caught up the same way), and two costs of a write beside the loop are charged to
    the budget too: the CPU time the writer's thread spent on it, which a loop bound by the host
    loses about all of (the write's Python holds the GIL; on the chip a 30-step epoch of a small
    CNN ran at 0.45x while a write went on beside it), and the time the state's copy took to
    move from the devices to the host, which slows a TPU's steps while it lasts: at most that
    long (GPT-2 small's 1.42 GiB copy cost the twelve steps queued beside it ~0.2 s on a v5e chip,
    `benchmarks/save_probe.py`; with it charged, over 200 steps of 8-step epochs the default
    checkpoint cost the step 1.8% while its loop-side time was 0.1% of the fit,
    `benchmarks/gpt.py`; charged on a GPU too, where it is not measured and may overlap the
    steps). `wait_for_writes` overrides the choice. A `ModelCheckpoint` you configure keeps
    exactly the schedule you give it.

    Example:
        >>> import fitjax as fj
        >>> trainer = fj.Trainer(max_epochs=3)  # adds DefaultCheckpoint()
        >>> isinstance(trainer.checkpoint_callback, fj.ModelCheckpoint)
        True
    """

    def __init__(self, *, share: float = SAVE_SHARE, wait_for_writes: bool | None = None) -> None:
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1:
            raise ValueError(f"DefaultCheckpoint(share=...) must be a number in (0, 1], got {share!r}")
        if wait_for_writes is not None and not isinstance(wait_for_writes, bool):
            raise ValueError(f"DefaultCheckpoint(wait_for_writes=...) must be True, False or None (decided by "
                             f"the platform the step runs on), got {wait_for_writes!r}")
        super().__init__()
        self.share = float(share)
        self.wait_for_writes = wait_for_writes
        self.save_seconds = 0.0  # time this fit's saves took
        self.write_wait_seconds = 0.0  # the part of it spent waiting for the writes to finish
        self.write_cpu_seconds = 0.0  # CPU time of this fit's writes left to run beside the loop
        self._cpu_seen = 0.0  # the writer's `write_cpu_seconds` already charged
        self.transfer_seconds = 0.0  # the devices' time moving this fit's copies to the host (a TPU's steps slow)
        self._moved_seen = 0.0  # the writer's `transfer_seconds` already charged
        self.skipped_saves = 0  # epoch-end saves left out by the budget in this fit
        self._last_cost: float | None = None
        self._started = time.monotonic()
        self._skipped: tuple[int, int] | None = None  # (epoch, step) of the newest unsaved epoch end
        self._name_epoch: int | None = None
        self._fit_step: int | None = None  # global_step when this fit's training began

    # Saves only at epoch ends (no `every_n_train_steps`, no `train_time_interval`) and waits for
    # each (a failure is raised there): a per-step hook would have nothing to do, so it has none
    # and the loop calls nothing of this callback at a step (~1 µs a step on the tiny MLP).
    on_train_batch_end = Callback.on_train_batch_end

    def on_fit_start(self, trainer, module) -> None:
        super().on_fit_start(trainer, module)
        self.save_seconds, self.write_wait_seconds, self.skipped_saves, self._last_cost = 0.0, 0.0, 0, None
        self.write_cpu_seconds, self._cpu_seen = 0.0, self._writer.write_cpu_seconds
        self.transfer_seconds, self._moved_seen = 0.0, self._writer.transfer_seconds
        self._started, self._skipped = time.monotonic(), None
        self._fit_step = trainer.global_step  # where this fit started (a resumed one: the checkpoint's)

    def on_train_end(self, trainer, module) -> None:
        if self._skipped is not None:  # the last epoch's end was not saved: save it now, as named then
            epoch, step = self._skipped
            if step == trainer.global_step:
                self._name_epoch = epoch
                try:
                    self._save(trainer, module, always=True)
                finally:
                    self._name_epoch = None

    def on_fit_end(self, trainer, module) -> None:
        super().on_fit_end(trainer, module)  # the last write done: the fit's figures hold every write
        if self._writer is not None:
            self._charge_writes()

    def on_exception(self, trainer, module, exception: BaseException) -> None:
        # Ctrl-C: the state where fit stopped, once a step ran (Lightning's default saves nothing)
        stepped = self._fit_step is not None and trainer.global_step > self._fit_step
        if (self._skipped is not None or (stepped and isinstance(exception, KeyboardInterrupt))) \
                and not trainer.received_sigterm:
            self._failing = True
            if isinstance(exception, KeyboardInterrupt):  # the wait below gives up on a stalled store
                checkpoint.writer().signalled("Ctrl-C")
            self._save_where_stopped(trainer, module)
        super().on_exception(trainer, module, exception)  # SIGTERM: saves there

    def teardown(self, trainer, module, stage: str) -> None:
        self._fit_step = None
        super().teardown(trainer, module, stage)

    def _save(self, trainer, module, *, always: bool = False, unscored: bool = False) -> None:
        if self._writer is not None:  # a write left to run beside the loop that failed: raised now,
            self._writer.raise_failure()  # at the next epoch end (this callback has no per-step hook)
        if not always and not self._affordable(trainer):
            self._skipped = (trainer.current_epoch, trainer.global_step)
            self.skipped_saves += 1
            return
        start = time.monotonic()
        super()._save(trainer, module, always=always, unscored=unscored)
        returned = time.monotonic()  # the state is on the host; the files are being written
        if self._writer is not None and self._waits(trainer):
            self._writer.wait()
            self.write_wait_seconds += time.monotonic() - returned
            # in the wait already
            self._cpu_seen, self._moved_seen = self._writer.write_cpu_seconds, self._writer.transfer_seconds
        self._last_cost = time.monotonic() - start
        self.save_seconds += self._last_cost
        self._skipped = None

    def _affordable(self, trainer) -> bool:
        """Whether saving now keeps the saves within `share` of the time since fit started, with
        no earlier save still being written; the processes agree (each measures its own clock),
        so all of them save or none does."""
        if self._last_cost is None:
            return True  # the first save measures what one costs
        elapsed = time.monotonic() - self._started
        writing = self._writer is not None and self._writer.busy()
        if self._writer is not None and not writing:  # the writes beside the loop are done: their costs known
            self._charge_writes()
        spent = self.save_seconds + self.write_cpu_seconds + self.transfer_seconds
        return trainer.agree(not writing and spent + self._last_cost <= self.share * elapsed)

    def _charge_writes(self) -> None:
        """Charges what the writes beside the loop cost since the last look (all of them done):
        the writer thread's CPU time and its transfers of copies made on the devices."""
        cpu = self._writer.write_cpu_seconds - self._cpu_seen
        moved = self._writer.transfer_seconds - self._moved_seen
        self._cpu_seen, self._moved_seen = self._cpu_seen + cpu, self._moved_seen + moved
        self.write_cpu_seconds += cpu
        self.transfer_seconds += moved
        if self._last_cost is not None:  # the next save is expected to cost what the last one did
            self._last_cost += cpu + moved

    def _waits(self, trainer) -> bool:
        if self.wait_for_writes is not None:
            return self.wait_for_writes
        return xla_cpu.saves_compete_with_the_step(trainer.strategy.platform)

    def _monitor_candidates(self, trainer) -> dict[str, float]:
        values = ModelCheckpoint._monitor_candidates(trainer)
        if self._name_epoch is not None:
            values["epoch"] = self._name_epoch
        return values
