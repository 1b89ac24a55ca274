"""LightningCLI with Lightning's `seed_everything_default` and Trainer flags with no JAX meaning
(issue 26, item 8)."""

from __future__ import annotations

import numpy as np
from cli_parts import Regressor as CLIRegressor, RegressorData

from fitjax.cli import LightningCLI


def test_lightning_cli_takes_benchmark_and_seed_everything_default(tmp_path):
    cli = LightningCLI(CLIRegressor, RegressorData, run=False, seed_everything_default=42,
                       trainer_defaults={"benchmark": True, "logger": False, "default_root_dir": str(tmp_path)},
                       args=[])
    assert cli.config["seed_everything"] == 42 and cli.trainer.seed == 42  # Lightning's key in the config
    assert np.random.get_state()[1][0] == np.random.RandomState(42).get_state()[1][0]  # numpy seeded
    cli = LightningCLI(CLIRegressor, RegressorData, run=False, seed_everything_default=42,
                       trainer_defaults={"logger": False}, args=["--trainer.seed=3", "--seed_everything=5"])
    assert (cli.config["seed_everything"], cli.trainer.seed) == (5, 3)
