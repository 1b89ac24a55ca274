"""One process of a 2-process fitjax run on localhost (4 virtual CPU devices each, gloo).

Run by tests/strategies/test_multiprocess.py as
`python multiprocess_worker.py OUT_DIR` with JAX_COORDINATOR_ADDRESS and JAX_PROCESS_ID set;
writes what it saw to OUT_DIR/process_<id>.pkl for the test to compare with one process.
"""

from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: helpers

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")

from jax.experimental import multihost_utils  # noqa: E402

import fitjax as fj  # noqa: E402
from helpers import LossHistory, Regressor, regression_data  # noqa: E402
from multiprocess_data import STRATEGIES, fit_and_predict, fit_metrics  # noqa: E402


class StopOnOne(fj.Callback):
    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step == 3 and jax.process_index() == 1:
            trainer.should_stop = True


def main(out_dir: Path) -> None:
    results = {}
    for i, name in enumerate(STRATEGIES):
        history = LossHistory()
        trainer = fj.Trainer(
            num_nodes=2, max_epochs=2, strategy=STRATEGIES[name](), callbacks=[history], enable_progress_bar=True,
            logger=fj.TensorBoardLogger(out_dir / "logs", name=name), log_every_n_steps=2,
        )
        assert jax.process_count() == 2 and len(trainer.devices) == 8
        module = Regressor()
        predictions, val, several = fit_and_predict(trainer, module)
        results[name] = {
            "losses": history.losses,
            # every host gets the full arrays, from the shards the others hold
            "params": multihost_utils.process_allgather(module.variables[0], tiled=True),
            "val": val,
            "several": several,
            "predictions": predictions,
            "kernel_spec": str(trainer.state.params["Dense_0"]["kernel"].sharding.spec),
            "log_dir": str(trainer.log_dir),
        }
    results["metrics"] = fit_metrics(fj.Trainer(num_nodes=2, max_epochs=2, strategy="dp", logger=False,
                                                enable_progress_bar=False, enable_checkpointing=False,
                                                enable_model_summary=False, num_sanity_val_steps=0))
    results["agree"] = [trainer.agree(jax.process_index() == 1), trainer.agree(False)]
    # a stop asked on process 1 only, at step 3 (between log steps): obeyed by both at step 4
    stopping = fj.Trainer(num_nodes=2, max_epochs=3, log_every_n_steps=2, callbacks=[StopOnOne()], logger=False,
                          enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False)
    stopping.fit(Regressor(), fj.DataLoader(regression_data(n=256), batch_size=32))  # 8 steps an epoch
    results["stopped"] = (stopping.global_step, stopping.should_stop)
    with open(out_dir / f"process_{jax.process_index()}.pkl", "wb") as f:
        pickle.dump(results, f)


if __name__ == "__main__":
    try:
        main(Path(sys.argv[1]))
    except BaseException:
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)  # not sys.exit: jax.distributed's shutdown would wait for the other process

