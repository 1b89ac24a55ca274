"""A checkpoint of a `Trainer(runs=...)` fit holds every run: a fit resumes them all bitwise, and
`load_from_checkpoint(path, run=i)` rebuilds run i with its hyperparameters and weights."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import fitjax as fj
from helpers import persistent_compile_cache, quiet_trainer
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


def test_a_run_stopped_early_keeps_its_parameters_while_the_other_goes_on():
    class Snapshot(fj.Callback):  # every run's parameters at each epoch's end (after EarlyStopping's check)
        def __init__(self):
            self.params = []

        def on_train_epoch_end(self, trainer, module):
            self.params.append(jax.device_get(trainer.state.params))

    # run 0 diverges (a non-finite loss stops it at the first check); run 1 never stops
    stopper = fj.EarlyStopping("train/loss_epoch", patience=10)
    snapshot = Snapshot()
    trainer = quiet_trainer(max_epochs=3, runs=[{"lr": 1e3, "wd": 0.0}, {"lr": 0.01, "wd": 0.0}],
                            callbacks=[stopper, snapshot])
    trainer.fit(Decayed(), loader())
    assert stopper.stopped_runs == [0, None] and trainer.global_step == 12  # the other run trained on
    final = jax.device_get(trainer.state.params)
    for got, want in zip(jax.tree.leaves(member(final, 0)), jax.tree.leaves(member(snapshot.params[0], 0))):
        np.testing.assert_array_equal(got, want)  # unchanged since its stop
    moved = member(final, 1)["Dense_1"]["kernel"], member(snapshot.params[0], 1)["Dense_1"]["kernel"]
    assert np.isfinite(moved[0]).all() and not np.array_equal(*moved)


def test_each_run_keeps_its_own_best_checkpoint(tmp_path):
    class Snapshot(fj.Callback):  # every run's weights at each epoch's end, when the save is made
        def __init__(self):
            self.variables = []

        def on_train_epoch_end(self, trainer, module):
            self.variables.append(jax.device_get((trainer.state.params, trainer.state.model_state)))

    # measured: run 0's val/loss is lowest after epoch 3 (2.25), run 1's after epoch 1 (5.61)
    runs = [{"lr": 0.01, "wd": 0.0}, {"lr": 0.1, "wd": 0.0}]
    saves = fj.ModelCheckpoint(tmp_path, filename="{epoch}", monitor="val/loss", save_top_k=1)
    snapshot = Snapshot()
    trainer = quiet_trainer(max_epochs=4, runs=runs, callbacks=[saves, snapshot], enable_checkpointing=True)
    trainer.fit(Decayed(), loader(), loader())

    best_epochs = [int(path.rpartition("epoch=")[2].split("-")[0]) for path in saves.best_model_paths]
    assert best_epochs == [3, 1]  # each run ranked on its own val/loss/run_<i>
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch=1-step=8", "epoch=3-step=16"]  # the top 1 of each
    results = trainer.run_results
    assert saves.best_model_scores == [results.best[i]["val/loss"] for i in range(2)]
    assert saves.best_model_score == min(saves.best_model_scores) and saves.best_model_path == saves.best_model_paths[0]
    for i, epoch in enumerate(best_epochs):
        module = Decayed.load_from_checkpoint(saves.best_model_paths[i], run=i)
        assert module.hparams.lr == runs[i]["lr"]
        for got, want in zip(jax.tree.leaves(module.variables), jax.tree.leaves(member(snapshot.variables[epoch], i))):
            np.testing.assert_array_equal(np.asarray(got), want)  # run i's weights at its best epoch


def test_a_run_stopped_before_its_checkpoint_stays_stopped_and_logs_nothing_after_resuming(tmp_path):
    # run 0 diverges and stops at epoch 0's end, before that epoch's save; the resumed fit's
    # loggers get no row of it, and the results table says it had stopped
    runs = [{"lr": 1e3, "wd": 0.0}, {"lr": 0.01, "wd": 0.0}]
    saves = fj.ModelCheckpoint(tmp_path / "ckpt", filename="{epoch}", every_n_epochs=1, save_top_k=-1)
    with persistent_compile_cache(tmp_path / "xla"):  # the resumed fit builds the same programs
        first = quiet_trainer(max_epochs=1, runs=runs, enable_checkpointing=True,
                              callbacks=[fj.EarlyStopping("train/loss_epoch", patience=10), saves])
        first.fit(Decayed(), loader())
        resumed = quiet_trainer(max_epochs=2, runs=runs, logger=fj.CSVLogger(tmp_path), log_every_n_steps=1)
        resumed.fit(Decayed(), loader(), ckpt_path=tmp_path / "ckpt" / "epoch=0-step=4")
    assert fj.runs.active_runs(resumed.state) == [False, True]
    folders = {p.parent.name: p for p in (tmp_path / "fitjax_logs").rglob("metrics.csv") if p.parent.name != "version_0"}
    assert sorted(folders) == ["lr=0.01"], folders  # run 0 (lr=1000) wrote no row
    assert "loss" in folders["lr=0.01"].read_text()
    assert resumed.run_results.final[0] == {} and resumed.run_results.table().splitlines()[2].endswith(" yes")
