"""ModelCheckpoint's facts, each derived from Lightning's own tests or source (named in each test)."""

from __future__ import annotations

import math
from pathlib import Path

import jax.numpy as jnp
import pytest
from helpers import Regressor, quiet_trainer, regression_data

import fitjax as fj
from fitjax import checkpoint

ONE_BATCH = regression_data(n=32)  # one batch of 32 an epoch, as Lightning's limit_train_batches=1


pytestmark = pytest.mark.usefixtures("compile_cache")  # tests/conftest.py


class NanMetric(Regressor):
    """Logs `val/nanny` = NaN (and `train/nanny`)."""

    def metrics(self, batch, outputs):
        return {"nanny": jnp.float32(jnp.nan)}


def _fit(ckpt, *, max_epochs=2, module=None, val=True, **trainer_args):
    trainer = quiet_trainer(max_epochs=max_epochs, enable_checkpointing=True, callbacks=[ckpt],
                            **trainer_args)
    loader = fj.DataLoader(ONE_BATCH, batch_size=32)
    trainer.fit(module or Regressor(batchnorm=False), loader, loader if val else None)
    return trainer


def _names(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


def test_a_reused_dirpath_gets_versioned_names_and_last_is_the_newest_run(tmp_path):
    """Lightning's test_ckpt_version_after_rerun_new_trainer: two runs of 2 epochs into one
    dirpath with monitor="epoch", filename="{epoch}", save_top_k=-1 keep all four checkpoints,
    the second run's named `-v1`. (fitjax appends `-step=<n>` to a template without `{step}`.)"""
    for run in range(2):
        ckpt = fj.ModelCheckpoint(tmp_path, monitor="epoch", filename="{epoch}", save_top_k=-1)
        if run:
            with pytest.warns(UserWarning, match="exists and holds checkpoints"):
                _fit(ckpt)
        else:
            _fit(ckpt)
        suffix = "-v1" if run else ""
        expected = {f"epoch=0-step=1{suffix}", f"epoch=1-step=2{suffix}"}
        assert {Path(p).name for p in ckpt.best_k_models} == expected
        assert ckpt.best_k_models[str(tmp_path / f"epoch=1-step=2{suffix}")] == 1.0
    assert _names(tmp_path) == {"epoch=0-step=1", "epoch=1-step=2", "epoch=0-step=1-v1", "epoch=1-step=2-v1"}
    # "last" is the newest save, the second run's: never the other run's weights
    assert ckpt.find("last", None) == tmp_path / "epoch=1-step=2-v1"


def test_save_top_k_zero_with_save_last_keeps_only_the_last_and_no_best(tmp_path):
    """Lightning's test_model_checkpoint_topk_zero: best_model_path "", best_model_score None,
    best_k_models {}, and only the last checkpoint on disk."""
    ckpt = fj.ModelCheckpoint(tmp_path, save_top_k=0, save_last=True)
    _fit(ckpt)
    assert ckpt.best_model_path == "" and ckpt.best_model_score is None and ckpt.best_k_models == {}
    assert _names(tmp_path) == {"epoch=1-step=2"}
    assert ckpt.last_model_path == str(tmp_path / "epoch=1-step=2")


@pytest.mark.parametrize("mode", ["min", "max"])
def test_a_nan_score_is_ranked_as_the_worst_infinity(tmp_path, mode):
    """Lightning's test_current_score_when_nan: a NaN monitored value is stored as +inf (min)
    or -inf (max), and the checkpoint is saved."""
    ckpt = fj.ModelCheckpoint(tmp_path, monitor="val/nanny", mode=mode)
    _fit(ckpt, max_epochs=1, module=NanMetric(batchnorm=False))
    expected = math.inf if mode == "min" else -math.inf
    assert ckpt.current_score == expected and ckpt.best_model_score == expected
    assert checkpoint.is_checkpoint(ckpt.best_model_path)


def test_a_monitor_never_logged_raises_listing_the_logged_keys(tmp_path):
    """Lightning's ModelCheckpoint._save_topk_checkpoint: a monitored key missing once
    validation has run raises, listing the keys; before any validation it warns."""
    with pytest.raises(ValueError, match=r"monitor='val/typo'.*'epoch'.*'step'.*'val/loss'"):
        _fit(fj.ModelCheckpoint(tmp_path, monitor="val/typo"))
    with pytest.warns(UserWarning, match=r"could not find the monitored key"):
        _fit(fj.ModelCheckpoint(tmp_path / "noval", monitor="val/typo"), val=False)
    assert _names(tmp_path / "noval") == set()  # nothing to rank by, no save_last: no save


def test_monitor_step_with_mode_max_keeps_the_newest(tmp_path):
    """Lightning's _monitor_candidates adds "step" (the global step) to the logged metrics."""
    ckpt = fj.ModelCheckpoint(tmp_path, monitor="step", mode="max")
    _fit(ckpt, max_epochs=3)
    assert ckpt.best_model_score == 3.0 and _names(tmp_path) == {"epoch=2-step=3"}


def test_validation_every_second_epoch_saves_only_fresh_scores(tmp_path):
    """Lightning's ModelCheckpoint._should_save_on_train_epoch_end: with
    check_val_every_n_epoch=2 it saves on validation end, so 4 epochs give 2 saves (epochs 1
    and 3), each scored by the validation that just ran; and each checkpoint stores the
    callback's state including itself (Lightning's test_current_score: scores [.., ..])."""
    ckpt = fj.ModelCheckpoint(tmp_path, monitor="val/loss", save_top_k=-1)
    trainer = _fit(ckpt, max_epochs=4, check_val_every_n_epoch=2)
    assert _names(tmp_path) == {"epoch=1-step=2", "epoch=3-step=4"}
    assert ckpt.best_k_models[str(tmp_path / "epoch=3-step=4")] == trainer.callback_metrics["val/loss"]
    for path, score in ckpt.best_k_models.items():
        stored = checkpoint.read_meta(path)["callbacks"][ckpt.state_key]
        assert stored["current_score"] == score and stored["last_model_path"] == path
        assert checkpoint.is_checkpoint(stored["best_model_path"])  # not one save behind
    # without validation data Lightning would never save here; fitjax saves at the epoch ends
    # once a validation was due (epoch 1 on) and none ran (docs/porting.md)
    _fit(fj.ModelCheckpoint(tmp_path / "noval", save_top_k=-1), max_epochs=3, val=False,
         check_val_every_n_epoch=2)
    assert _names(tmp_path / "noval") == {"epoch=1-step=2", "epoch=2-step=3"}


def test_top_1_by_score_deletes_the_worse_and_its_best_path_exists(tmp_path):
    """Lightning's check_monitor_top_k: a worse score than the k-th best is not saved."""
    ckpt = fj.ModelCheckpoint(tmp_path, monitor="val/loss", save_top_k=1)
    _fit(ckpt, max_epochs=3)
    (best,) = _names(tmp_path)
    assert ckpt.best_model_path == str(tmp_path / best)
    stored = checkpoint.read_meta(tmp_path / best)["callbacks"][ckpt.state_key]
    assert stored["best_model_path"] == str(tmp_path / best)
