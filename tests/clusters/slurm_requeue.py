"""One task of an sbatch job that SLURM's requeue signal interrupts (`scancel --signal=USR1`).

`srun python slurm_requeue.py OUT_DIR` trains the tiny regressor (2 tasks x 2 CPU devices, dp)
for 16 steps. The first run (SLURM_RESTART_COUNT unset) writes OUT_DIR/training_<rank> from step 3
on and slows to 0.2 s a step, so that the signal lands mid-run; fit then saves
`run/hpc_ckpt_1`, the task writes OUT_DIR/stopped_<rank>.json (in `on_exception`), and process 0
requeues the job as fit returns. The
requeued run is the same command: fit() resumes from that checkpoint by itself, then the same fit
runs again uninterrupted in the same processes; process 0 writes both runs' final parameters
to OUT_DIR/final.pkl.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import time
from pathlib import Path

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
os.environ["JAX_PLATFORMS"] = "cpu"
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: helpers

import jax  # noqa: E402
import numpy as np  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")

import fitjax as fj  # noqa: E402
from helpers import Regressor, regression_data  # noqa: E402

out = Path(sys.argv[1])
restart = int(os.environ.get("SLURM_RESTART_COUNT") or 0)


class Marks(fj.Callback):
    def on_train_start(self, trainer, module):
        self.resumed_at = trainer.global_step

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if restart == 0 and trainer.global_step >= 3:
            (out / f"training_{jax.process_index()}").touch()
            time.sleep(0.2)

    def on_exception(self, trainer, module, exception):
        # the stop, written inside fit: the requeue comes after, and SLURM's SIGTERM with it
        (out / f"stopped_{jax.process_index()}.json").write_text(json.dumps(
            {"step": trainer.global_step, "received_sigterm": trainer.received_sigterm}))


def fit(root: Path, callbacks) -> tuple[fj.Trainer, list[np.ndarray]]:
    trainer = fj.Trainer(max_steps=16, strategy="dp", default_root_dir=root, logger=False, callbacks=callbacks,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    module = Regressor()
    trainer.fit(module, fj.DataLoader(regression_data(n=128), batch_size=32, shuffle=True, seed=1))
    return trainer, [np.asarray(x) for x in jax.tree.leaves(module.variables)]


marks = Marks()
trainer, params = fit(out / "run", [marks])
if trainer.global_step < 16:  # stopped by the requeue signal; SLURM ends this run and starts the next
    sys.stdout.flush()
    os._exit(0)  # not Python's exit: SLURM is about to end the job, no barrier with the peer
_, reference = fit(out / "reference", [])
if jax.process_index() == 0:
    (out / "final.pkl").write_bytes(pickle.dumps({"restart": restart, "resumed_at": marks.resumed_at,
                                                  "step": trainer.global_step, "params": params,
                                                  "reference": reference}))
