"""Checkpoints on real disk: exact resume, top-k, strategies, loading, and the fault cases."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import flax.linen as nn
import jax
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from helpers import LossHistory, Regressor, assert_trees_close, quiet_trainer, regression_data

import fitjax as fj

DATA = regression_data(n=96)  # 3 batches of 32 an epoch
VAL = regression_data(n=64, seed=1)


def _loader(data=DATA):
    return fj.DataLoader(data, batch_size=32, shuffle=True, seed=3)


def _trainer(ckpt_dir, history, *, strategy="single", **kwargs):
    callbacks = [history, fj.ModelCheckpoint(ckpt_dir, **kwargs.pop("ckpt", {}))]
    return quiet_trainer(strategy=strategy, callbacks=callbacks, enable_checkpointing=True,
                         log_every_n_steps=2, **kwargs)


pytestmark = pytest.mark.usefixtures("compile_cache")  # tests/conftest.py


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    """4 uninterrupted epochs (12 steps), a checkpoint after each epoch."""
    folder = tmp_path_factory.mktemp("full")
    history = LossHistory()
    trainer = _trainer(folder, history, max_epochs=4, ckpt={"save_top_k": -1})
    module = Regressor()
    trainer.fit(module, _loader(), fj.DataLoader(VAL, batch_size=32))
    return trainer, module, history.losses, folder


def test_resumed_runs_equal_an_uninterrupted_one_bitwise(tmp_path, full_run):
    full, full_module, full_losses, _ = full_run
    first = LossHistory()  # saves after steps 3 (epoch end), 4 (inside epoch 1) and 6 (epoch end)
    _trainer(tmp_path, first, max_epochs=2, ckpt={"every_n_train_steps": 4, "every_n_epochs": 1,
                                                  "save_top_k": -1}).fit(
        Regressor(), _loader(), fj.DataLoader(VAL, batch_size=32))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch=0-step=3", "epoch=1-step=4", "epoch=1-step=6"]

    for done in (6, 4):  # at an epoch's end, inside an epoch
        second = LossHistory()
        trainer = _trainer(tmp_path / f"from{done}", second, max_epochs=4)
        ckpt_path = tmp_path / f"epoch=1-step={done}"
        module = Regressor()
        trainer.fit(module, _loader(), fj.DataLoader(VAL, batch_size=32), ckpt_path=ckpt_path)
        assert len(second.losses) == 12 - done  # no batch replayed or skipped
        # CPU XLA is deterministic for the same program and inputs: equality is exact
        assert first.losses[:done] + second.losses == full_losses
        assert_trees_close(module.variables, full_module.variables, rtol=0, atol=0)
        assert (trainer.global_step, trainer.current_epoch) == (12, 4)
        assert trainer.callback_metrics["val/loss"] == full.callback_metrics["val/loss"]
        assert trainer.callback_metrics["train/loss_epoch"] == pytest.approx(
            full.callback_metrics["train/loss_epoch"], rel=1e-6)  # host sums merged in another order


def test_restore_across_strategies_and_after_a_max_steps_stop(tmp_path, full_run):
    _, full_module, full_losses, _ = full_run
    runs = [("dp", {"max_steps": 4}), ("single", {"max_steps": 8}), ("dp", {"max_epochs": 4})]
    losses = []
    for i, (strategy, stop) in enumerate(runs):  # dp -> single -> dp, each stopping mid-epoch
        history = LossHistory()
        trainer = _trainer(tmp_path, history, strategy=strategy, **stop)
        module = Regressor()
        trainer.fit(module, _loader(), ckpt_path="last" if i else None)
        losses += history.losses
        devices = 8 if strategy == "dp" else 1
        assert len(jax.tree.leaves(trainer.state.params)[0].sharding.device_set) == devices
    # dp and one device reduce the batch in a different order: equal to float32 rounding
    np.testing.assert_allclose(losses, full_losses, rtol=1e-5, atol=1e-6)
    assert_trees_close(module.variables, full_module.variables, rtol=1e-5, atol=1e-6)


def test_top_k_by_monitored_metric_keeps_the_best_files(tmp_path):
    class ValLosses(fj.Callback):
        def __init__(self):
            self.by_epoch = {}

        def on_validation_end(self, trainer, module):
            if not trainer.sanity_checking:  # the sanity check logs nothing
                self.by_epoch[trainer.current_epoch] = trainer.callback_metrics["val/loss"]

    seen = ValLosses()
    # "max" keeps the worst two by val/loss (here epochs 1 and 4): ranking, not recency
    ckpt = fj.ModelCheckpoint(tmp_path, filename="{epoch}-{val/loss:.3f}", monitor="val/loss",
                              mode="max", save_top_k=2, save_last=True)
    module = Regressor()
    trainer = quiet_trainer(max_epochs=6, strategy="single", callbacks=[seen, ckpt], enable_checkpointing=True)
    trainer.fit(module, _loader(), fj.DataLoader(VAL, batch_size=32))

    best_two = sorted(seen.by_epoch, key=seen.by_epoch.get)[-2:]
    expected = {f"epoch={e}-val_loss={seen.by_epoch[e]:.3f}-step={3 * (e + 1)}" for e in [*best_two, 5]}
    assert {p.name for p in tmp_path.iterdir()} == expected
    best = max(seen.by_epoch, key=seen.by_epoch.get)
    assert best_two != [4, 5]
    assert Path(ckpt.best_model_path).name.startswith(f"epoch={best}-")
    assert ckpt.best_model_score == pytest.approx(seen.by_epoch[best])
    assert Path(ckpt.last_model_path).name.startswith("epoch=5-")
    # validate(ckpt_path="best") evaluates exactly the weights that scored best
    (res,) = trainer.validate(module, fj.DataLoader(VAL, batch_size=32), ckpt_path="best")
    assert res["val/loss"] == pytest.approx(seen.by_epoch[best], rel=1e-6)


def test_load_from_checkpoint_predicts_and_orbax_alone_reads_the_params(full_run):
    _, module, _, folder = full_run
    last = folder / "epoch=3-step=12"
    x = {"x": DATA["x"][:40]}
    expected = quiet_trainer(strategy="dp").predict(module, fj.DataLoader(x, batch_size=40))

    loaded = Regressor.load_from_checkpoint(last)
    assert loaded.hparams == {"lr": 0.05, "batchnorm": True}
    got = quiet_trainer(strategy="single").predict(loaded, fj.DataLoader(x, batch_size=40))
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
    assert Regressor.load_from_checkpoint(last, lr=1.0).hparams.lr == 1.0

    state = ocp.StandardCheckpointer().restore(last / "state")
    assert_trees_close(state["params"], module.variables[0], rtol=0, atol=0)
    assert int(state["step"]) == 12


def test_a_changed_model_gets_an_error_naming_the_first_mismatch(tmp_path, full_run):
    saved = full_run[3] / "epoch=0-step=3"
    with pytest.raises(ValueError, match=r"has 'params/BatchNorm_0/\w+', which the module lacks"):
        _trainer(tmp_path, LossHistory(), max_epochs=2).fit(Regressor(batchnorm=False), _loader(),
                                                            ckpt_path=saved)
    wider = {"x": np.concatenate([DATA["x"], DATA["x"]], axis=1), "y": DATA["y"]}
    with pytest.raises(ValueError, match=r"'params/Dense_0/kernel': saved shape \(8, 32\), module shape \(16, 32\)"):
        _trainer(tmp_path, LossHistory(), max_epochs=2).fit(Regressor(), _loader(wider), ckpt_path=saved)


def test_sigterm_saves_at_the_current_step_and_resumes_exactly(tmp_path, full_run):
    class Preempt(fj.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if trainer.global_step == 4:
                os.kill(os.getpid(), signal.SIGTERM)  # a real signal, handled by fit

    _, full_module, full_losses, _ = full_run
    first = LossHistory()
    trainer = quiet_trainer(max_epochs=4, strategy="single", log_every_n_steps=2, enable_checkpointing=True,
                            callbacks=[first, Preempt(), fj.ModelCheckpoint(tmp_path)])
    trainer.fit(Regressor(), _loader(), fj.DataLoader(VAL, batch_size=32))  # returns cleanly
    assert trainer.received_sigterm and trainer.global_step == 4
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler is uninstalled
    assert [p.name for p in tmp_path.iterdir()] == ["epoch=1-step=4"]

    second = LossHistory()
    module = Regressor()
    _trainer(tmp_path, second, max_epochs=4).fit(module, _loader(), fj.DataLoader(VAL, batch_size=32),
                                                 ckpt_path="last")
    assert first.losses + second.losses == full_losses
    assert_trees_close(module.variables, full_module.variables, rtol=0, atol=0)


def test_an_exception_saves_with_save_on_exception_and_reaches_the_user(tmp_path):
    boom = RuntimeError("user bug")

    class Fails(fj.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if trainer.global_step == 5:
                raise boom

    csv = fj.CSVLogger(tmp_path / "logs")
    trainer = quiet_trainer(max_epochs=3, strategy="single", logger=csv, log_every_n_steps=1,
                            enable_checkpointing=True,
                            callbacks=[Fails(), fj.ModelCheckpoint(tmp_path / "ck", save_on_exception=True)])
    with pytest.raises(RuntimeError) as info:
        trainer.fit(Regressor(), _loader())
    assert info.value is boom
    assert Path(trainer.checkpoint_callback.last_model_path).name == "epoch=1-step=5"
    rows = (csv.log_dir / "metrics.csv").read_text().splitlines()
    assert len(rows) > 5  # flushed: a row per logged step reached the file


def test_default_checkpointing_under_the_logger_folder_and_resume_continues_it(tmp_path):
    trainer = fj.Trainer(max_epochs=2, strategy="single", default_root_dir=tmp_path,
                         logger=fj.CSVLogger(tmp_path), enable_progress_bar=False)
    trainer.fit(Regressor(), _loader())
    folder = tmp_path / "fitjax_logs" / "version_0" / "checkpoints"
    assert [p.name for p in folder.iterdir()] == ["epoch=1-step=6"]  # save_top_k=1: the newest

    trainer = fj.Trainer(max_epochs=3, strategy="single", default_root_dir=tmp_path,
                         logger=fj.CSVLogger(tmp_path), enable_progress_bar=False)
    trainer.fit(Regressor(), _loader(), ckpt_path="last")
    assert trainer.global_step == 9 and trainer.logger.version == 0
    assert [p.name for p in folder.iterdir()] == ["epoch=2-step=9"]


class Wide(fj.LitModule):
    """A few MB of state, so that a save takes a while to write."""

    def __init__(self):
        super().__init__()
        self.model = nn.Dense(1024)

    def loss(self, model, batch):
        return ((model(batch["x"]) - batch["y"]) ** 2).mean()

    def configure_optimizer(self):
        return optax.sgd(0.01, momentum=0.9)


def _wide_data():
    rng = np.random.default_rng(0)
    return {"x": rng.normal(size=(64, 1024)).astype(np.float32),
            "y": rng.normal(size=(64, 1024)).astype(np.float32)}


_KILLED_CHILD = textwrap.dedent("""
    import os, signal, sys, time
    from pathlib import Path
    sys.path[:0] = [{here!r}, {tests!r}]  # this file's folder, and tests/ for helpers
    import fitjax as fj
    from test_checkpoint import Wide, _wide_data

    folder = Path({folder!r})

    class KillDuringSave(fj.Callback):
        # looks for the save in progress for up to 0.5 s (sleeping, so the writer's thread runs):
        # a single look right after a save is queued missed its folder for 200 steps on a loaded
        # machine, the writer not yet scheduled
        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            deadline = time.monotonic() + 0.5
            while trainer.global_step >= 3 and time.monotonic() < deadline:
                writing = [p for p in folder.iterdir() if "orbax-checkpoint-tmp" in p.name]
                if writing:
                    print("killing at", trainer.global_step, writing[0].name, flush=True)
                    os.kill(os.getpid(), signal.SIGKILL)
                time.sleep(0.001)

    trainer = fj.Trainer(max_steps=200, strategy="single", logger=False, enable_progress_bar=False,
                         callbacks=[KillDuringSave(),
                                    fj.ModelCheckpoint(folder, every_n_train_steps=1, save_top_k=2)])
    trainer.fit(Wide(), fj.DataLoader(_wide_data(), batch_size=8))
    print("not killed")
""")


def test_kill_9_during_a_save_leaves_the_previous_checkpoints_usable(tmp_path):
    folder = tmp_path / "ck"
    folder.mkdir()
    script = _KILLED_CHILD.format(here=str(Path(__file__).parent), tests=str(Path(__file__).parents[1]),
                                  folder=str(folder))
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""}
    child = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert child.returncode == -signal.SIGKILL, child.stdout + child.stderr
    killed_at = int(child.stdout.split("killing at")[1].split()[0])

    leftovers = [p for p in folder.iterdir() if "orbax-checkpoint-tmp" in p.name]
    assert leftovers  # the torn save
    # every other folder is a complete checkpoint: a deletion never leaves a half-deleted one
    # (its lease file stays, dead with its process, until the next fit's start)
    assert all(fj.checkpoint.is_checkpoint(p) for p in folder.iterdir() if p not in leftovers and p.is_dir())
    last = fj.checkpoint.latest_checkpoint([folder])
    assert last is not None and fj.checkpoint.read_meta(last)["global_step"] < killed_at
    meta = fj.checkpoint.read_meta(last)
    assert meta["module"].endswith("Wide")
    state = ocp.StandardCheckpointer().restore(last / "state")
    assert np.isfinite(state["params"]["kernel"]).all() and int(state["step"]) == meta["global_step"]

    # the next run cleans the leftovers, resumes from the newest complete checkpoint, and keeps
    # its top 2 (the killed run's own, continued: the older ones are deleted, nothing else)
    step = meta["global_step"]
    ckpt = fj.ModelCheckpoint(folder, every_n_train_steps=1, save_top_k=2)
    trainer = quiet_trainer(max_steps=step + 2, enable_checkpointing=True, callbacks=[ckpt])
    trainer.fit(Wide(), fj.DataLoader(_wide_data(), batch_size=8), ckpt_path="last")
    assert trainer.global_step == step + 2
    assert sorted(fj.checkpoint.read_meta(p)["global_step"] for p in folder.iterdir()) == [step + 1, step + 2]


def test_docstring_examples_run(tmp_path, monkeypatch):
    import doctest
    import importlib

    monkeypatch.chdir(tmp_path)
    for name in ("fitjax.callbacks.model_checkpoint", "fitjax.checkpoint._format"):
        assert doctest.testmod(importlib.import_module(name)).failed == 0
