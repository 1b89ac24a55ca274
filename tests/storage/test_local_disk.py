"""What a probe of local-disk runs found, each fixed: version folders claimed atomically,
`ckpt_path="last"` with nothing saved yet, a checkpoint missing its meta, the precision rule."""

from __future__ import annotations

import shutil
import threading
import warnings
from pathlib import Path

import pytest
from helpers import LossHistory, Regressor, quiet_trainer, regression_data

import fitjax as fj

DATA = regression_data(n=64)  # 4 batches of 16 an epoch


pytestmark = pytest.mark.usefixtures("compile_cache")  # tests/conftest.py


def _fit(ckpt, *, max_epochs=2, ckpt_path=None, **trainer_args):
    history = LossHistory()
    trainer = quiet_trainer(max_epochs=max_epochs, callbacks=[history, ckpt], enable_checkpointing=True,
                            **trainer_args)
    trainer.fit(Regressor(batchnorm=False), fj.DataLoader(DATA, batch_size=16), ckpt_path=ckpt_path)
    return trainer, history


@pytest.mark.parametrize("logger", [fj.loggers.TensorBoardLogger, fj.loggers.CSVLogger])
def test_runs_started_at_once_in_one_folder_get_a_version_each(tmp_path, logger):
    # 8 fits claiming their version at the same moment (`Trainer.fit` calls `claim_version`
    # first; threads here: the claim is one mkdir, the same race between processes)
    start, versions = threading.Barrier(8), []

    def run():
        made = logger(tmp_path)
        start.wait()
        made.claim_version()
        versions.append(made.version)

    threads = [threading.Thread(target=run) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(versions) == list(range(8))
    assert sorted(p.name for p in (tmp_path / "fitjax_logs").iterdir()) == [f"version_{v}" for v in range(8)]


def test_last_with_no_checkpoint_yet_warns_and_starts_from_scratch(tmp_path):
    """Lightning's `_parse_ckpt_path`: 'ckpt_path="last" is set, but there is no last checkpoint
    available. No checkpoint will be loaded.' (a warning; the fit starts fresh)."""
    with pytest.warns(UserWarning, match=r"ckpt_path='last' found no checkpoint in .*starting from scratch"):
        trainer, history = _fit(fj.ModelCheckpoint(tmp_path), ckpt_path="last")
    assert trainer.global_step == 8 and len(history.losses) == 8
    # the requeued job's next run resumes what the first one saved
    trainer, history = _fit(fj.ModelCheckpoint(tmp_path), max_epochs=3, ckpt_path="last")
    assert trainer.global_step == 12 and len(history.losses) == 4


def test_a_newest_checkpoint_without_its_meta_is_named_like_damaged_data(tmp_path):
    _fit(fj.ModelCheckpoint(tmp_path, save_top_k=-1))
    older, newest = tmp_path / "epoch=0-step=4", tmp_path / "epoch=1-step=8"
    shutil.rmtree(newest / "meta")
    with pytest.warns(UserWarning, match=rf"{newest}' is damaged: meta/metadata is missing.*Resuming from '{older}'"):
        trainer, history = _fit(fj.ModelCheckpoint(tmp_path), max_epochs=3, ckpt_path="last")
    assert trainer.global_step == 12 and len(history.losses) == 8  # resumed after step 4
    # an older incomplete folder (the newest is intact) is no news: no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fj.ModelCheckpoint(tmp_path).find("last", None).name == "epoch=2-step=12"


def test_another_precision_is_an_error_naming_both_as_the_guide_says(tmp_path):
    _fit(fj.ModelCheckpoint(tmp_path), precision="32-true")
    with pytest.raises(ValueError, match=r"saved with precision='32-true', and this run uses "
                                         r"precision='bf16-mixed'. Resume with precision='32-true'"):
        _fit(fj.ModelCheckpoint(tmp_path), max_epochs=3, ckpt_path="last", precision="bf16-mixed")
    guide = (Path(__file__).resolve().parents[2] / "docs" / "guides" / "checkpoints.md").read_text()
    assert "resuming with another precision or\noptimizer is an error" in guide


def test_a_resumed_run_continues_its_version_and_leaves_no_empty_one(tmp_path):
    logger = lambda: fj.loggers.CSVLogger(tmp_path)
    _fit(fj.ModelCheckpoint(), logger=logger(), default_root_dir=tmp_path)
    trainer, _ = _fit(fj.ModelCheckpoint(), max_epochs=3, logger=logger(), default_root_dir=tmp_path,
                      ckpt_path="last")
    assert trainer.logger.version == 0 and trainer.global_step == 12
    assert [p.name for p in (tmp_path / "fitjax_logs").iterdir()] == ["version_0"]


def test_a_resume_with_other_hyperparameters_warns_and_keeps_the_runs_hparams_yaml(tmp_path):
    logger = lambda: fj.loggers.CSVLogger(tmp_path)
    _fit(fj.ModelCheckpoint(), max_epochs=1, logger=logger(), default_root_dir=tmp_path)
    saved = tmp_path / "fitjax_logs" / "version_0" / "hparams.yaml"
    before = saved.read_text()
    assert "lr: 0.05" in before
    trainer = quiet_trainer(max_epochs=2, enable_checkpointing=True, logger=logger(), default_root_dir=tmp_path,
                            callbacks=[fj.ModelCheckpoint()])
    with pytest.warns(UserWarning, match=r"other hyperparameters than this module's \(lr: 0\.05 -> 0\.1\)"):
        trainer.fit(Regressor(lr=0.1, batchnorm=False), fj.DataLoader(DATA, batch_size=16), ckpt_path="last")
    assert trainer.global_step == 8 and saved.read_text() == before


class OtherExperiment(Regressor):
    """Another experiment's module, logged under the same root and logger name."""


def test_last_resumes_its_own_run_not_another_experiments_newer_one(tmp_path):
    def fit(module_cls, *, max_epochs, logger=None, **kwargs):
        trainer = quiet_trainer(max_epochs=max_epochs, enable_checkpointing=True, default_root_dir=tmp_path,
                                logger=logger or fj.loggers.CSVLogger(tmp_path), callbacks=[fj.ModelCheckpoint()])
        trainer.fit(module_cls(batchnorm=False), fj.DataLoader(DATA, batch_size=16), ckpt_path="last", **kwargs)
        return trainer

    with pytest.warns(UserWarning, match="found no checkpoint"):
        fit(Regressor, max_epochs=1)  # version_0: step 4
    with pytest.warns(UserWarning, match=r"skipped newer checkpoints saved by another module than OtherExperiment: "
                                         r".*version_0/checkpoints/epoch=0-step=4' \(.*Regressor\)"):
        other = fit(OtherExperiment, max_epochs=2)  # its own version, from scratch
    assert (other.logger.version, other.global_step) == (1, 8)
    with pytest.warns(UserWarning, match=r"skipped .*version_1/checkpoints/epoch=1-step=8' \(.*OtherExperiment\)"):
        ours = fit(Regressor, max_epochs=3)  # version_1's is newer, and not this run's
    assert (ours.logger.version, ours.global_step) == (0, 12)
    # a named version looks there only (version_0's Regressor checkpoint is not taken)
    with pytest.warns(UserWarning, match=r"found no checkpoint in \['[^']*version_1/checkpoints'\]"):
        fit(Regressor, max_epochs=1, logger=fj.loggers.CSVLogger(tmp_path, version=1))  # not version_0's
    assert sorted(p.name for p in (tmp_path / "fitjax_logs").iterdir()) == ["version_0", "version_1"]
