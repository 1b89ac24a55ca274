"""The run both sides of the multi-process test do: the same data, strategies and stages."""

from __future__ import annotations

from helpers import regression_data

import fitjax as fj
from fitjax.strategies import FSDP

STRATEGIES = {"dp": fj.strategies.DataParallel, "fsdp": lambda: FSDP(data=2, fsdp=4, min_size_to_shard=0)}


def fit_and_predict(trainer: fj.Trainer, module: fj.LitModule):
    """2 epochs of 4 steps; validation and predict end on partial batches (100 = 3×32 + 4, 77 = 4×16
    + 13), so one process's slice of the last batch is smaller than the other's, or empty."""
    trainer.fit(module, fj.DataLoader(regression_data(n=128), batch_size=32, shuffle=True, seed=1),
                fj.DataLoader(regression_data(n=100, seed=1), batch_size=32))
    predictions = trainer.predict(module, fj.DataLoader({"x": regression_data(n=77, seed=2)["x"]}, batch_size=16))
    val = dict(trainer.callback_metrics)
    # two loaders (45 = 32 + 13, split 8 + 5): each example of each counted once
    several = trainer.validate(module, [fj.DataLoader(regression_data(n=100, seed=1), batch_size=32),
                                        fj.DataLoader(regression_data(n=45, seed=3), batch_size=32)], verbose=False)
    return predictions, val, several
