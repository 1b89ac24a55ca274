"""A user's script for `test_ctrl_c.py`'s Ctrl-C before `fit`: `python ctrl_c_script.py`. It
imports fitjax (and with it JAX), sets up for two seconds (arrays on the device and garbage
collections: JAX runs a callback at each), then fits; it prints each phase it reaches."""

from __future__ import annotations

import gc
import sys
import time
from pathlib import Path

print("importing", flush=True)
import fitjax as fj  # noqa: E402
import jax.numpy as jnp  # noqa: E402

print("imported", flush=True)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers import Regressor, regression_data  # noqa: E402

print("setting up", flush=True)
ready = time.monotonic() + 2
while time.monotonic() < ready:  # the set-up: device arrays, collections
    jnp.ones(8).block_until_ready()
    gc.collect()
print("set up", flush=True)
trainer = fj.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False)
trainer.fit(Regressor(), fj.DataLoader(regression_data(32), batch_size=8))
print("trained to the end", flush=True)
