"""`StepTimer`: the wall time of a window of optimizer steps inside `Trainer.fit`, for the
benchmarks that time a fit from inside (`gpt.py`, `lm_shapes.py`)."""

from __future__ import annotations

import time

import jax

import fitjax as fj
from fitjax.callbacks._base import ignores_batch  # the timer never reads the batch


class StepTimer(fj.Callback):
    """Times optimizer steps `warmup`..`warmup + steps` (the first ones compile): one host sync
    at each end of the window, none between; `fit_seconds` is the whole fit's, its last saves
    included."""

    def __init__(self, warmup: int, steps: int):
        self.warmup, self.last, self.steps = warmup, warmup + steps, steps
        self.start = self.seconds = self.fit_start = self.fit_seconds = None

    def on_fit_start(self, trainer, module):
        self.fit_start, self.seconds = time.perf_counter(), None

    @ignores_batch
    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step == self.warmup:
            jax.block_until_ready(trainer.state)
            self.start = time.perf_counter()
        elif trainer.global_step == self.last and self.seconds is None:
            jax.block_until_ready(trainer.state)
            self.seconds = time.perf_counter() - self.start

    def on_train_end(self, trainer, module):
        self.fit_seconds = time.perf_counter() - self.fit_start
