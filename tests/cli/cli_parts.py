"""Modules and data the CLI tests name by class path (`cli_parts.RegressorData`, ...)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: helpers

import flax.linen as nn  # noqa: E402
import optax  # noqa: E402

import fitjax as fj  # noqa: E402
from helpers import Regressor, regression_data  # noqa: E402


class RegressorData(fj.DataModule):
    """`regression_data` splits: 128 train rows, 100 val/test rows, 77 rows to predict.

    Args:
        batch_size: rows per batch (the global batch with several processes).
        seed: the train loader's shuffle seed.
    """

    def __init__(self, batch_size: int = 32, seed: int = 1):
        self.batch_size = batch_size
        self.seed = seed

    def train_dataloader(self):
        return fj.DataLoader(regression_data(n=128), batch_size=self.batch_size, shuffle=True, seed=self.seed)

    def val_dataloader(self):
        return fj.DataLoader(regression_data(n=100, seed=1), batch_size=self.batch_size)

    def test_dataloader(self):
        return fj.DataLoader(regression_data(n=100, seed=3), batch_size=self.batch_size)

    def predict_dataloader(self):
        return fj.DataLoader({"x": regression_data(n=77, seed=2)["x"]}, batch_size=16)


class PlainRegressor(fj.LitModule):
    """A regressor without `configure_optimizer`: the config's `optimizer:` section supplies it.

    Args:
        width: hidden units of the MLP.
    """

    def __init__(self, width: int = 16):
        super().__init__()
        self.save_hyperparameters()
        self.model = nn.Sequential([nn.Dense(width), nn.relu, nn.Dense(1)])

    def loss(self, model, batch):
        return ((model(batch["x"]) - batch["y"]) ** 2).mean()

    def predict_step(self, model, batch):
        return model(batch["x"])


# The launched runs of tests/cli/test_launch.py (launch_fit.py), and the same in one process.
LAUNCH_COMMON = ["--trainer.max_epochs=2", "--trainer.log_every_n_steps=2", "--trainer.enable_model_summary=false",
                 "--trainer.enable_checkpointing=false"]
LAUNCH_RUNS = {
    "dp": ["--trainer.strategy=dp", "--trainer.profiler=jax"],
    "fsdp": ["--trainer.strategy=FSDP", "--trainer.strategy.data=2", "--trainer.strategy.fsdp=4",
             "--trainer.strategy.min_size_to_shard=0"],
}


def small_regressor(lr: float = 0.1) -> Regressor:
    """A function building the module: `LightningCLI` accepts it in place of a class.

    Args:
        lr: the learning rate.
    """
    return Regressor(lr=lr, batchnorm=False)


class InjectedRegressor(Regressor):
    """`Regressor` whose learning rate StochasticWeightAveraging can drive."""

    def configure_optimizer(self):
        return optax.inject_hyperparams(optax.sgd)(learning_rate=self.hparams.lr, momentum=0.9)


def swa_fit():
    """SWA from epoch 2 of 4 on dp with BatchNorm; the module's final variables (the average and
    the recomputed statistics). Run by tests/cli/launch_swa.py and in the test's own process."""
    trainer = fj.Trainer(max_epochs=4, strategy="dp", logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False,
                         callbacks=[fj.StochasticWeightAveraging(swa_lrs=0.01, swa_epoch_start=2)])
    module = InjectedRegressor()
    trainer.fit(module, fj.DataLoader(regression_data(n=128), batch_size=32, shuffle=True, seed=1))
    return module.variables
