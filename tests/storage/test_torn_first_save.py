"""A run killed with SIGKILL during its *first* save to a store never blocks a restart: `"last"`
and a `fitjax launch --max-restarts` restart skip the torn prefix (a listing requires
`.fitjax-complete`) and start from scratch, as on local disk; the restarted fit's start-up
clean-up removes the torn prefix and logs it."""

from __future__ import annotations

import logging

import pytest
from helpers import LossHistory, Regressor, quiet_trainer, regression_data
from store_parts import listed
from test_s3 import _killed_during_upload

import fitjax as fj
from fitjax import checkpoint
from fitjax.loop import _preemption, _resume

DATA = regression_data(n=64)

pytestmark = pytest.mark.usefixtures("compile_cache")  # tests/conftest.py


def test_a_kill_during_the_first_store_save_restarts_from_scratch(proxy, bucket, tmp_path, monkeypatch, caplog):
    url = f"{bucket}/first"
    _, pid = _killed_during_upload(proxy, url, tmp_path, 1, lambda sent: sent[-1] == ".fitjax-complete")  # all but it
    lease, torn = listed(url)  # the killed fit's lease on the folder, and its torn save
    assert lease.startswith(".fitjax-lease-") and lease.endswith(f"-{pid}") and torn == "epoch=0-step=1"
    assert checkpoint.damage(f"{url}/epoch=0-step=1") == ".fitjax-complete is missing (an incomplete upload)"

    history = LossHistory()
    trainer = quiet_trainer(max_steps=3, enable_checkpointing=True,
                            callbacks=[history, fj.ModelCheckpoint(url, every_n_train_steps=1, save_top_k=1)])
    # what a `fitjax launch` restart asks (ckpt_path=None in a restarted process): nothing to resume
    monkeypatch.setenv(_preemption.RESTART_COUNT_VAR, "1")
    assert _preemption.auto_resume_path(trainer, None) is None
    monkeypatch.delenv(_preemption.RESTART_COUNT_VAR)
    with pytest.warns(UserWarning, match="ckpt_path='last' found no checkpoint"):
        assert _resume.resolve_ckpt_path(trainer, "last", where="Trainer.fit(ckpt_path=...)") is None

    with caplog.at_level(logging.WARNING, logger="fitjax"), pytest.warns(UserWarning, match="starting from scratch"):
        trainer.fit(Regressor(batchnorm=False), fj.DataLoader(DATA, batch_size=16), ckpt_path="last")
    assert trainer.global_step == 3 and len(history.losses) == 3  # from scratch, to the end
    assert f"removing {url}/epoch=0-step=1," in caplog.text  # the torn prefix, removed at start
    assert f"removing {url}/{lease}, the lease of a fit that is gone" in caplog.text
    assert listed(url) == ["epoch=0-step=3"]
    checkpoint.verify(f"{url}/epoch=0-step=3")


def test_a_killed_runs_write_probe_is_removed_at_the_next_start_and_none_is_left(bucket):
    import fsspec

    url = f"{bucket}/probed"
    fs, root = fsspec.core.url_to_fs(url)
    fs.pipe_file(f"{root}/.fitjax-write-probe-999999-0", b"")  # a run killed between its two requests
    trainer = quiet_trainer(max_steps=1, enable_checkpointing=True,
                            callbacks=[fj.ModelCheckpoint(url, every_n_train_steps=1)])
    trainer.fit(Regressor(batchnorm=False), fj.DataLoader(DATA, batch_size=16))
    assert listed(url) == ["epoch=0-step=1"]  # the stale probe gone, this run's own removed, no lease left


def test_checkpoint_warnings_point_at_the_users_line(tmp_path):
    folder = tmp_path / "ckpts"
    trainer = quiet_trainer(max_steps=1, enable_checkpointing=True, callbacks=[fj.ModelCheckpoint(folder)])
    with pytest.warns(UserWarning, match="found no checkpoint") as caught:
        trainer.fit(Regressor(batchnorm=False), fj.DataLoader(DATA, batch_size=16), ckpt_path="last")
    assert {w.filename for w in caught} == {__file__}
    trainer = quiet_trainer(max_steps=1, enable_checkpointing=True, callbacks=[fj.ModelCheckpoint(folder)])
    with pytest.warns(UserWarning, match="exists and holds checkpoints") as caught:
        trainer.fit(Regressor(batchnorm=False), fj.DataLoader(DATA, batch_size=16))
    assert {w.filename for w in caught} == {__file__}
