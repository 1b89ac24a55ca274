"""One process of `fitjax launch --nproc 2 --devices-per-process 4 launch_fit.py OUT_DIR`.

Runs `LightningCLI(Regressor, RegressorData)`'s `fit` with each strategy of `cli_parts.LAUNCH_RUNS`
(the coordinator, process count and id come from the launcher's environment, read by
`Trainer(num_nodes=None)`) and writes the gathered final parameters to OUT_DIR/params.pkl
(process 0).
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import jax
from cli_parts import LAUNCH_COMMON, LAUNCH_RUNS, Regressor, RegressorData
from jax.experimental import multihost_utils

from fitjax.cli import LightningCLI

out = Path(sys.argv[1])
results = {}
for name, args in LAUNCH_RUNS.items():
    cli = LightningCLI(Regressor, RegressorData, args=["fit", *args, *LAUNCH_COMMON,
                                                      f"--trainer.default_root_dir={out / name}"])
    results[name] = {
        "params": multihost_utils.process_allgather(cli.model.variables[0], tiled=True),
        "processes": jax.process_count(),
        "local_devices": jax.local_device_count(),
        "devices": len(cli.trainer.devices),
    }
# (not before the first run: jax.distributed starts before anything touches a device)
print(f"process {jax.process_index()} of {jax.process_count()}, {jax.local_device_count()} devices", flush=True)
if jax.process_index() == 0:
    (out / "params.pkl").write_bytes(pickle.dumps(results))
