"""The fit the resume-elsewhere tests share (tests/checkpoint/test_resume_elsewhere.py and the
processes its `fitjax launch` starts, resume_worker.py): a small regression on a shuffled
`fj.DataLoader` of 3 batches of 32 an epoch, recording what each step saw."""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import numpy as np
from jax.experimental import multihost_utils

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: helpers, in a launched process too

import fitjax as fj  # noqa: E402
from helpers import Regressor, quiet_trainer, regression_data  # noqa: E402

DATA = regression_data(n=96)  # 3 batches of 32 an epoch: step 4 is inside epoch 1


def loader() -> fj.DataLoader:
    return fj.DataLoader(DATA, batch_size=32, shuffle=True, seed=3)


class Seen(fj.Callback):
    """Each step's loss (the first run's with several), and the examples of its global batch (their
    first feature, in batch order; gathered from every process with several)."""

    def __init__(self):
        self.losses: list[float] = []
        self.rows: list[np.ndarray] = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.losses.append(float(outputs["loss"] if "loss" in outputs else outputs["loss/run_0"]))
        x = batch["x"]
        if isinstance(x, jax.Array) and not x.is_fully_addressable:  # every process calls the hook
            x = multihost_utils.process_allgather(x, tiled=True)
        self.rows.append(np.asarray(x)[:, 0].copy())


def fit(*, strategy: str, max_steps: int, devices="auto", ckpt_path=None, module=None, data=None,
        callbacks=(), **kwargs):
    """Fits `module` (a `Regressor`) to global step `max_steps`, from `ckpt_path` when given;
    returns the trainer, what it saw and the module."""
    seen = Seen()
    module = Regressor() if module is None else module
    trainer = quiet_trainer(strategy=strategy, devices=devices, max_steps=max_steps, callbacks=[seen, *callbacks],
                            enable_checkpointing=bool(callbacks), **kwargs)
    trainer.fit(module, loader() if data is None else data, ckpt_path=ckpt_path)
    return trainer, seen, module
