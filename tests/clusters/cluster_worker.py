"""One process of a run started by a cluster engine (srun, sbatch, torchrun, mpirun, fitjax launch).

`python cluster_worker.py OUT_DIR [STRATEGY ...]` trains the tiny regressor of tests/strategies/multiprocess_data
with each strategy named (default: all; 4 virtual CPU devices per process, gloo collectives), taking everything about
the processes from the detected cluster environment, and writes what it saw to
OUT_DIR/process_<rank>.pkl: the environment's numbers and the gathered final parameters.
"""

from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
os.environ["JAX_PLATFORMS"] = "cpu"
TESTS = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(TESTS), str(TESTS / "strategies")]  # helpers, multiprocess_data

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")

from jax.experimental import multihost_utils  # noqa: E402

import fitjax as fj  # noqa: E402
from helpers import Regressor, regression_data  # noqa: E402
from multiprocess_data import STRATEGIES  # noqa: E402


def main(out_dir: Path, names: list[str]) -> None:
    results = {}
    for name in names or list(STRATEGIES):
        strategy = STRATEGIES[name]
        trainer = fj.Trainer(max_epochs=2, strategy=strategy(), logger=False, enable_checkpointing=False,
                             enable_model_summary=False, enable_progress_bar=False)
        module = Regressor()
        trainer.fit(module, fj.DataLoader(regression_data(n=128), batch_size=32, shuffle=True, seed=1))
        results[name] = multihost_utils.process_allgather(module.variables[0], tiled=True)
    env = trainer.cluster_environment
    results["environment"] = {
        "type": type(env).__name__, "world_size": env.world_size(), "global_rank": env.global_rank(),
        "local_rank": env.local_rank(), "node_rank": env.node_rank(), "num_nodes": env.num_nodes(),
        "process_index": jax.process_index(), "process_count": jax.process_count(),
        "local_devices": jax.local_device_count(), "devices": len(trainer.devices),
    }
    try:  # Lightning's meaning: devices counts one machine's devices, here 2 processes x 4
        fj.Trainer(devices=4, logger=False)
    except ValueError as exc:
        results["devices_error"] = str(exc)
    with open(out_dir / f"process_{jax.process_index()}.pkl", "wb") as f:
        pickle.dump(results, f)


if __name__ == "__main__":
    try:
        main(Path(sys.argv[1]), sys.argv[2:])
    except BaseException:
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)  # not sys.exit: jax.distributed's shutdown would wait for the other process
