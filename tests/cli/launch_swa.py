"""One process of `fitjax launch --nproc 2 --devices-per-process 4 launch_swa.py OUT_DIR`.

Fits `swa_fit()` (StochasticWeightAveraging, dp, BatchNorm: the statistics are recomputed with a
pass over the train data after the last epoch) and writes the gathered final variables to
OUT_DIR/swa.pkl (process 0).
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import jax
import numpy as np
from cli_parts import swa_fit
from jax.experimental import multihost_utils

out = Path(sys.argv[1])
variables = swa_fit()
gathered = [np.asarray(multihost_utils.process_allgather(x, tiled=True)) for x in jax.tree.leaves(variables)]
print(f"process {jax.process_index()} of {jax.process_count()} done", flush=True)
if jax.process_index() == 0:
    (out / "swa.pkl").write_bytes(pickle.dumps(gathered))
