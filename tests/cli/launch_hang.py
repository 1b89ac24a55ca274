"""One process of a launched fit in which rank 1 hangs in a hook at step 5 (a sleep of 10 minutes)
while rank 0 goes on until it waits for rank 1 in a collective. `fj.callbacks.Watchdog(timeout=5)`
must end both. Writes OUT_DIR/hang_at (the time rank 1 started to sleep) and OUT_DIR/pid_<rank>."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import jax
from cli_parts import Regressor, RegressorData

import fitjax as fj

out = Path(sys.argv[1])


class HangOnRank1(fj.Callback):
    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step == 1:
            (out / f"pid_{jax.process_index()}").write_text(str(os.getpid()))
        if trainer.global_step == 5 and jax.process_index() == 1:
            (out / "hang_at").write_text(repr(time.time()))
            time.sleep(600)


trainer = fj.Trainer(max_epochs=100_000, strategy="dp", logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=10,
                     callbacks=[HangOnRank1(), fj.callbacks.Watchdog(timeout=3)])
trainer.fit(Regressor(), datamodule=RegressorData())
