"""Several `ModelCheckpoint` callbacks in one Trainer: every save goes through the process's one
writer, and each callback keeps exactly the checkpoints, best and last paths it keeps alone.

Lightning is the contract: `trainer.checkpoint_callback` is the first of `checkpoint_callbacks`
(its test_configure_model_checkpoint), callbacks with one state key are refused when the Trainer
is made (its `_validate_callbacks_list`), each callback's state is restored by a resume (its
test_callbacks_state_fit_ckpt_path), `ckpt_path="last"` is the newest checkpoint of any checkpoint
callback's folder (its `_parse_ckpt_path`), and a name taken in a shared folder gets `-v1`
(`_get_metric_interpolated_filepath_name`, as in its test_ckpt_version_after_rerun_new_trainer).
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from helpers import Regressor, quiet_trainer, regression_data

import fitjax as fj
from fitjax import checkpoint
from fitjax.strategies import FSDP

DATA = regression_data(n=64)  # 4 batches of 16 an epoch
VAL = regression_data(n=32, seed=1)


pytestmark = pytest.mark.usefixtures("compile_cache")  # tests/conftest.py


def _three(root: Path) -> list[fj.ModelCheckpoint]:
    """Every ModelCheckpoint option among three callbacks (and train_time_interval in `_two`)."""
    return [
        fj.ModelCheckpoint(root / "best", filename="{epoch}-{val/loss:.4f}", monitor="val/loss",
                           mode="min", save_top_k=2, verbose=True),
        fj.ModelCheckpoint(root / "every2", every_n_epochs=2, save_top_k=-1, save_on_exception=True),
        fj.ModelCheckpoint(root / "steps", monitor="step", mode="max", every_n_train_steps=3,
                           save_top_k=1, save_last=True),
    ]


def _two(root: Path | None) -> list[fj.ModelCheckpoint]:
    """The issue's pair (the best by val/loss, and saves on a clock), in one folder when `root`
    is None (the logger's `checkpoints/`)."""
    return [fj.ModelCheckpoint(root and root / "best", monitor="val/loss", save_top_k=2),
            fj.ModelCheckpoint(root and root / "clock", train_time_interval=datetime.timedelta(0),
                               save_top_k=2)]


def _fit(callbacks, *, max_epochs=3, strategy="single", ckpt_path=None, **trainer_args):
    trainer = quiet_trainer(max_epochs=max_epochs, callbacks=callbacks, enable_checkpointing=True,
                            strategy=strategy, **trainer_args)
    trainer.fit(Regressor(batchnorm=False), fj.DataLoader(DATA, batch_size=16, shuffle=True, seed=2),
                fj.DataLoader(VAL, batch_size=16), ckpt_path=ckpt_path)
    return trainer


def _books(ckpt: fj.ModelCheckpoint) -> dict:
    """What a callback promises, by checkpoint name: its folder's contents, best, last, top k."""
    name = lambda p: Path(p).name if p else p
    return {"files": sorted(p.name for p in Path(ckpt.dirpath).iterdir()),
            "best": name(ckpt.best_model_path), "score": ckpt.best_model_score,
            "last": name(ckpt.last_model_path),
            "top_k": {name(p): s for p, s in ckpt.best_k_models.items()}}


def _params(path) -> list[np.ndarray]:
    import jax
    return [np.asarray(x) for x in jax.tree.leaves(checkpoint.restore_variables(path)[0])]


def test_three_callbacks_keep_what_each_keeps_alone_with_the_same_weights(tmp_path):
    together = _three(tmp_path / "together")
    _fit(together)
    for i, ckpt in enumerate(together):
        alone = _three(tmp_path / f"alone{i}")[i]
        _fit([alone])
        assert _books(ckpt) == _books(alone)
        for name in _books(ckpt)["files"]:  # the same checkpoints, bitwise
            for a, b in zip(_params(Path(ckpt.dirpath) / name), _params(Path(alone.dirpath) / name)):
                np.testing.assert_array_equal(a, b)
    best, every2, steps = (_books(c) for c in together)
    assert best["files"] == sorted(best["top_k"]) and len(best["files"]) == 2
    assert every2["files"] == ["epoch=1-step=8"]  # every second epoch of three
    assert steps["files"] == ["epoch=2-step=12"] and steps["last"] == steps["best"] == "epoch=2-step=12"


@pytest.mark.parametrize("strategy", ["dp", "fsdp"])
def test_three_callbacks_under_dp_and_fsdp_save_what_one_device_saves(tmp_path, strategy):
    single, sharded = _three(tmp_path / "single"), _three(tmp_path / strategy)
    _fit(single)
    _fit(sharded, strategy=FSDP(min_size_to_shard=0) if strategy == "fsdp" else strategy)
    for one, other in zip(single, sharded):
        mine, theirs = _books(one), _books(other)
        assert mine["files"] == theirs["files"] and mine["last"] == theirs["last"]
        for name in mine["files"]:
            for a, b in zip(_params(Path(one.dirpath) / name), _params(Path(other.dirpath) / name)):
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_two_callbacks_in_one_folder_take_v1_names_and_never_delete_each_others(tmp_path):
    trainer = _fit(_two(None), default_root_dir=tmp_path, logger=fj.loggers.CSVLogger(tmp_path))
    best, clock = trainer.checkpoint_callbacks
    assert trainer.checkpoint_callback is best
    folder = Path(best.dirpath)
    assert folder == Path(clock.dirpath) == tmp_path / "fitjax_logs" / "version_0" / "checkpoints"
    names = {Path(p).name for p in [*best._kept, *clock._kept]}
    assert {p.name for p in folder.iterdir()} == names  # nothing else written, nothing lost
    assert all(checkpoint.is_checkpoint(folder / n) for n in names)
    # the clock saves every step; at an epoch's end the best-by-loss, first in the list, saved
    # first at the same step, if that loss ranked in its top 2: the clock's save is then `-v1`
    best_names = sorted(Path(p).name for p in best._kept)
    assert best_names[0] == "epoch=0-step=4" and all("-v" not in n for n in best_names)
    suffix = "-v1" if "epoch=2-step=12" in best_names else ""
    assert sorted(Path(p).name for p in clock._kept) == ["epoch=2-step=11", f"epoch=2-step=12{suffix}"]


def test_a_resume_restores_each_callbacks_state_and_continues_as_uninterrupted(tmp_path):
    whole = _three(tmp_path / "whole")
    _fit(whole, max_epochs=4)
    _fit(_three(tmp_path / "split"), max_epochs=2)
    resumed = _three(tmp_path / "split")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _fit(resumed, max_epochs=4, ckpt_path="last")
    assert not [str(w.message) for w in caught if "checkpoint" in str(w.message)]  # its own folders
    for one, other in zip(whole, resumed):
        assert _books(one) == _books(other)


def test_last_is_the_newest_checkpoint_of_any_checkpoint_callback(tmp_path):
    # the step saves come last: "last" resumes from them, not from the first callback's older save
    first = [fj.ModelCheckpoint(tmp_path / "epochs", every_n_epochs=1, save_top_k=-1),
             fj.ModelCheckpoint(tmp_path / "steps", every_n_train_steps=1, save_top_k=1)]
    _fit(first, max_epochs=1, limit_train_batches=3)
    again = [fj.ModelCheckpoint(tmp_path / "epochs", every_n_epochs=1, save_top_k=-1),
             fj.ModelCheckpoint(tmp_path / "steps", every_n_train_steps=1, save_top_k=1)]
    found = again[0].find("last", quiet_trainer(callbacks=again, enable_checkpointing=True))
    assert found == tmp_path / "steps" / "epoch=0-step=3"  # saved after epoch=0-step=3 of "epochs"


def test_two_callbacks_with_one_state_key_are_refused_naming_the_fix(tmp_path):
    with pytest.raises(ValueError, match=r"two ModelCheckpoint with the state key .*another filename="):
        quiet_trainer(enable_checkpointing=True,
                      callbacks=[fj.ModelCheckpoint(tmp_path / "a"), fj.ModelCheckpoint(tmp_path / "b")])
    quiet_trainer(enable_checkpointing=True,  # another filename is enough
                  callbacks=[fj.ModelCheckpoint(tmp_path / "a"), fj.ModelCheckpoint(tmp_path / "b", filename="b-{step}")])


def test_three_callbacks_over_two_launched_processes_save_what_one_process_saves(tmp_path):
    # each process writes its shards of every save, in the same order, through its one writer
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.run([sys.executable, "-m", "fitjax.cli", "launch", "--nproc", "2", "--devices-per-process",
                           "4", str(Path(__file__).with_name("launch_checkpoints.py")), str(tmp_path)],
                          cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:]
    launched = [json.loads((tmp_path / f"books_{rank}.json").read_text()) for rank in range(2)]
    # the same bookkeeping on both (process 0 deletes, and may still be at it when process 1 lists)
    assert [{**b, "files": None} for b in launched[0]] == [{**b, "files": None} for b in launched[1]]
    single = _three(tmp_path / "single")
    _fit(single, strategy=FSDP(data=2, fsdp=4, min_size_to_shard=0))
    for one, books in zip(single, launched[0]):
        mine = _books(one)
        assert books["files"] == mine["files"] and books["last"] == mine["last"] and books["best"] == mine["best"]
        for name in mine["files"]:
            for a, b in zip(_params(Path(one.dirpath) / name), _params(tmp_path / "launched" / Path(one.dirpath).name / name)):
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
