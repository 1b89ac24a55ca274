"""One process of `fitjax launch --nproc 2 --devices-per-process 4 resume_worker.py CKPT STEPS STRATEGY OUT`.

Resumes `resume_parts`' fit from checkpoint CKPT under STRATEGY on the 8 devices of both
processes, trains to global step STEPS, saves the checkpoint OUT/saved (every process takes its
part) and writes what this process saw (each step's loss and its batch's examples)
to OUT/process_<i>.pkl, for tests/checkpoint/test_resume_elsewhere.py to compare with one process.
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import jax
from resume_parts import fit

ckpt, steps, strategy, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
trainer, seen, _ = fit(strategy=strategy, max_steps=steps, ckpt_path=ckpt)
assert jax.process_count() == 2 and len(trainer.devices) == 8 and trainer.global_step == steps
trainer.save_checkpoint(out / "saved")
(out / f"process_{jax.process_index()}.pkl").write_bytes(pickle.dumps({"losses": seen.losses, "rows": seen.rows}))
