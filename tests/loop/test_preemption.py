"""Lightning's "hpc" checkpoint outside SLURM: `fit(ckpt_path="hpc")` and which signal requeues.

The SLURM run itself (the requeue signal, one checkpoint, `scontrol requeue`, the resumed job) is
tests/clusters/test_requeue.py; the agreed SIGTERM stop over processes is tests/cli/test_launch.py.
"""

from __future__ import annotations

import signal

import pytest
from helpers import Regressor, quiet_trainer, regression_data

import fitjax as fj
from fitjax.loop._preemption import requeue_signal
from fitjax.plugins.environments import LightningEnvironment, SLURMEnvironment


class StartStep(fj.Callback):
    def on_train_start(self, trainer, module):
        self.step = trainer.global_step


def test_ckpt_path_hpc_resumes_from_the_newest_hpc_checkpoint(tmp_path):
    data = fj.DataLoader(regression_data(n=64), batch_size=16)
    trainer = quiet_trainer(max_steps=2, strategy="single", default_root_dir=tmp_path)
    trainer.fit(Regressor(), data)
    trainer.save_checkpoint(tmp_path / "hpc_ckpt_1")
    more = quiet_trainer(max_steps=3, strategy="single", default_root_dir=tmp_path)
    more.fit(Regressor(), data, ckpt_path=tmp_path / "hpc_ckpt_1")
    more.save_checkpoint(tmp_path / "hpc_ckpt_2")
    (tmp_path / "hpc_ckpt_3").mkdir()  # an interrupted save: not a checkpoint, passed over

    start = StartStep()
    resumed = quiet_trainer(max_steps=4, strategy="single", default_root_dir=tmp_path, callbacks=[start])
    resumed.fit(Regressor(), data, ckpt_path="hpc")
    assert start.step == 3 and resumed.global_step == 4


def test_ckpt_path_hpc_without_one_says_where_it_looked(tmp_path):
    trainer = quiet_trainer(max_steps=1, strategy="single", default_root_dir=tmp_path)
    with pytest.raises(FileNotFoundError, match=r"ckpt_path='hpc'\) found no complete hpc_ckpt_<n> checkpoint in "
                                                rf"'{tmp_path}' \(Trainer\(default_root_dir=...\)\)"):
        trainer.fit(Regressor(), fj.DataLoader(regression_data(n=32), batch_size=16), ckpt_path="hpc")


def test_only_slurm_with_auto_requeue_has_a_requeue_signal():
    assert requeue_signal(SLURMEnvironment()) == signal.SIGUSR1  # Lightning's default
    assert requeue_signal(SLURMEnvironment(requeue_signal=signal.SIGHUP)) == signal.SIGHUP
    assert requeue_signal(SLURMEnvironment(auto_requeue=False)) is None
    assert requeue_signal(LightningEnvironment()) is None
