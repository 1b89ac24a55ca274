"""One process of a launched fit that runs until preempted: `fitjax launch` forwards SIGTERM, and
fitjax's fit saves a checkpoint at an agreed step and returns. Writes OUT_DIR/training_<rank>
and OUT_DIR/pid_<rank> once a step ran (SIGTERM handling is then in place), OUT_DIR/result_<rank>.json
at the end: the step it stopped after, and the step and time it first saw the signal after."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import jax
from cli_parts import Regressor, RegressorData

import fitjax as fj

out = Path(sys.argv[1])


class Started(fj.Callback):
    """Says when training runs; records the step after which this process first saw SIGTERM."""

    def __init__(self):
        self.seen_at = None

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step == 1:
            (out / f"pid_{jax.process_index()}").write_text(str(os.getpid()))
            (out / f"training_{jax.process_index()}").touch()
        if trainer.received_sigterm and self.seen_at is None:
            self.seen_at = (trainer.global_step, time.monotonic())


# log steps far apart: the stop must not wait for one
started = Started()
trainer = fj.Trainer(max_epochs=100_000, strategy="dp", default_root_dir=out, logger=False, callbacks=[started],
                     enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=10_000)
trainer.fit(Regressor(), datamodule=RegressorData())
(out / f"result_{jax.process_index()}.json").write_text(json.dumps(
    {"received_sigterm": trainer.received_sigterm, "step": trainer.global_step, "seen_at": started.seen_at,
     "stopped_at": time.monotonic(),
     "saved": trainer.checkpoint_callback.last_model_path or trainer.checkpoint_callback.best_model_path}))
