"""One process of `fitjax launch --nproc 2 --devices-per-process 4 launch_s3_fsdp.py URL OUT_DIR`.

Under FSDP over both processes (a state no process holds whole): fits 6 steps straight; fits 3
steps saving every step to the store folder URL; then fits to step 6 again from `ckpt_path="last"`
(read back from the store). Process 0 writes both runs' losses and final parameters to
OUT_DIR/runs.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]

import jax  # noqa: E402
import numpy as np  # noqa: E402
from helpers import LossHistory, Regressor, persistent_compile_cache, quiet_trainer, regression_data  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402

import fitjax as fj  # noqa: E402
from fitjax.strategies import FSDP  # noqa: E402

url, out = sys.argv[1], Path(sys.argv[2])


def fit(steps, *, save, ckpt_path=None):
    history = LossHistory()
    callbacks = [history] + ([fj.ModelCheckpoint(url, every_n_train_steps=1, save_top_k=2)] if save else [])
    trainer = quiet_trainer(max_steps=steps, strategy=FSDP(data=2, fsdp=4, min_size_to_shard=0),
                            enable_checkpointing=save, callbacks=callbacks)
    module = Regressor(batchnorm=False)
    trainer.fit(module, fj.DataLoader(regression_data(n=64), batch_size=16, shuffle=True, seed=2),
                ckpt_path=ckpt_path)
    whole = multihost_utils.process_allgather(module.variables, tiled=True)  # every shard, on every process
    return history.losses, [np.asarray(x).tolist() for x in jax.tree.leaves(whole)]


with persistent_compile_cache(out / "xla"):  # each program compiled once for the three fits
    straight = fit(6, save=False)
    first, _ = fit(3, save=True)
    rest, params = fit(6, save=True, ckpt_path="last")
if jax.process_index() == 0:
    (out / "runs.json").write_text(json.dumps({"straight": straight, "resumed": [first + rest, params]}))
