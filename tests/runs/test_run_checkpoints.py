"""A checkpoint of a `Trainer(runs=...)` fit holds every run: a fit resumes them all bitwise, and
`load_from_checkpoint(path, run=i)` rebuilds run i with its hyperparameters and weights."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import fitjax as fj
from helpers import quiet_trainer
from test_many_runs import Decayed, loader, member

def plain(state):
    """The state's arrays, its keys as their data."""
    return jax.device_get(state.replace(rng=jax.random.key_data(state.rng)))


RUNS = [{"lr": 0.01, "wd": 0.1}, {"lr": 0.05, "wd": 0.0}]


def test_every_run_resumes_bitwise_and_loads_alone(tmp_path):
    saves = fj.ModelCheckpoint(tmp_path, filename="{epoch}", every_n_epochs=1, save_top_k=-1)
    straight = quiet_trainer(max_epochs=2, runs=RUNS, callbacks=[saves], enable_checkpointing=True)
    straight.fit(Decayed(), loader())

    resumed = quiet_trainer(max_epochs=2, runs=RUNS)
    resumed.fit(Decayed(), loader(), ckpt_path=tmp_path / "epoch=0-step=4")
    for got, want in zip(jax.tree.leaves(plain(resumed.state)), jax.tree.leaves(plain(straight.state))):
        np.testing.assert_array_equal(got, want)

    module = Decayed.load_from_checkpoint(tmp_path / "epoch=1-step=8", run=1)
    assert module.hparams.lr == 0.05 and module.hparams.wd == 0.0
    for got, want in zip(jax.tree.leaves(module.variables), jax.tree.leaves(member(
            (straight.state.params, straight.state.model_state), 1))):
        np.testing.assert_array_equal(np.asarray(got), want)
    with pytest.raises(ValueError, match=r"holds 2 runs \(lr=0.01,wd=0.1, lr=0.05,wd=0\); pass `run=` an index"):
        Decayed.load_from_checkpoint(tmp_path / "epoch=1-step=8")
