"""The run of tests/integrations/test_ray.py, on a local Ray head with 2 workers.

`python ray_train.py OUT_DIR [--kill]` trains the tiny regressor (dp, 2 workers x 4 CPU devices,
4 epochs, a Ray checkpoint per epoch). With `--kill`, the first worker group's rank 1 kills itself
(SIGKILL) at the start of epoch 2; Ray restarts the group (`max_failures=1`), which resumes from the
last reported checkpoint. Each attempt's rank 0 writes where it started; the last one writes the
final parameters (OUT_DIR/params.pkl) and Ray's result.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
EPOCHS = 4


def train(config: dict) -> None:
    sys.path[:0] = [str(TESTS)]  # helpers
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    from jax.experimental import multihost_utils

    import fitjax as fj
    from fitjax.integrations.ray import RayReport, checkpoint_path
    from helpers import Regressor, regression_data

    out = Path(config["out"])
    resume = checkpoint_path()
    started: dict = {}

    class KillRankOne(fj.Callback):
        def on_train_start(self, trainer, module):
            started["from_step"], started["from_epoch"] = trainer.global_step, trainer.current_epoch

        def on_train_epoch_start(self, trainer, module):
            if config["kill"] and resume is None and trainer.current_epoch == 2 and jax.process_index() == 1:
                os.kill(os.getpid(), signal.SIGKILL)  # a worker lost mid-run

    trainer = fj.Trainer(max_epochs=EPOCHS, strategy="dp", callbacks=[RayReport(), KillRankOne()], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    module = Regressor()
    started.update({"resume": resume is not None, "environment": type(trainer.cluster_environment).__name__,
               "processes": jax.process_count(), "devices": len(trainer.devices)})
    trainer.fit(module, fj.DataLoader(regression_data(n=128), batch_size=32, shuffle=True, seed=1), ckpt_path=resume)
    params = multihost_utils.process_allgather(module.variables[0], tiled=True)
    if jax.process_index() == 0:
        attempts = sorted(out.glob("attempt_*.pkl"))
        (out / f"attempt_{len(attempts)}.pkl").write_bytes(pickle.dumps(started))
        (out / "params.pkl").write_bytes(pickle.dumps(params))


def main(out: Path, kill: bool) -> None:
    import ray

    from fitjax.integrations.ray import RayTrainer

    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=200 * 2**20, log_to_driver=True)
    try:
        result = RayTrainer(train, num_workers=2, config={"out": str(out), "kill": kill}, max_failures=1,
                            storage_path=out / "ray", name="fit",
                            worker_env={"XLA_FLAGS": "--xla_force_host_platform_device_count=4",
                                        "JAX_PLATFORMS": "cpu"}).fit()
        (out / "result.pkl").write_bytes(pickle.dumps({
            "metrics": result.metrics, "checkpoint": None if result.checkpoint is None else result.checkpoint.path,
            "error": None if result.error is None else repr(result.error)}))
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]), "--kill" in sys.argv[2:])
