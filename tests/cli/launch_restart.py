"""One process of a launched fit that the test kills (`kill -9` of rank 1) once a checkpoint is
complete; `fitjax launch --max-restarts 1` starts both again and `fit()` resumes from that checkpoint
with no change to this script. The restarted run then trains the same fit again from scratch, without
interruption, in the same processes: OUT_DIR/params.pkl holds both runs' final parameters.

Writes OUT_DIR/pid_<rank>_<restart> once training runs, OUT_DIR/ready once a checkpoint is complete
(the first run waits for it, then its steps slow down to 0.2 s so that the kill lands mid-run)."""

from __future__ import annotations

import os
import pickle
import sys
import time
from pathlib import Path

import jax
import numpy as np
from cli_parts import Regressor, RegressorData

import fitjax as fj
from fitjax import checkpoint

out = Path(sys.argv[1])
restart = int(os.environ["FITJAX_RESTART_COUNT"])
# the restarted processes and the reference fit load the compiled steps instead of compiling again
for name, value in (("jax_compilation_cache_dir", str(out / "xla")), ("jax_persistent_cache_min_compile_time_secs", 0),
                    ("jax_persistent_cache_min_entry_size_bytes", 0)):
    jax.config.update(name, value)


class Marks(fj.Callback):
    def on_train_start(self, trainer, module):
        self.resumed_at = trainer.global_step

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        (out / f"pid_{jax.process_index()}_{restart}").write_text(str(os.getpid()))
        saved = trainer.checkpoint_callback.last_model_path
        if restart == 0 and saved:  # the first run, from its first save (step 4) on
            deadline = time.monotonic() + 60
            while not checkpoint.is_checkpoint(saved) and time.monotonic() < deadline:
                time.sleep(0.05)  # the save completes on the writer thread
            (out / "ready").touch()
            time.sleep(0.2)  # 12 steps left: >= 2.4 s for the test's kill to land mid-run


def run(root: Path, callbacks, **kwargs) -> fj.Trainer:
    trainer = fj.Trainer(max_steps=16, strategy="dp", default_root_dir=root, logger=False, callbacks=callbacks,
                         enable_progress_bar=False, enable_model_summary=False, **kwargs)
    module = Regressor()
    trainer.fit(module, RegressorData().train_dataloader())  # no validation: one program to compile
    return trainer, [np.asarray(x) for x in jax.tree.leaves(module.variables)]


marks = Marks()
trainer, params = run(out / "run", [marks, fj.ModelCheckpoint(every_n_train_steps=4, save_top_k=-1)])
_, reference = run(out / "reference", [], enable_checkpointing=False)
if jax.process_index() == 0:
    (out / "params.pkl").write_bytes(pickle.dumps({"restart": restart, "resumed_at": marks.resumed_at,
                                                   "step": trainer.global_step, "params": params,
                                                   "reference": reference}))
