"""Ray Train on a local head with 2 workers: one worker killed mid-run, the group Ray restarts
resumes from the last reported checkpoint and ends with the uninterrupted run's parameters."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import Regressor, assert_trees_close, quiet_trainer, regression_data

import fitjax as fj

pytest.importorskip("ray.train.v2.jax", reason="Ray Train is not installed (pip install 'ray[train]': the dev extra)")

HERE = Path(__file__).resolve().parent
WORKTREE = HERE.parents[1]


def test_a_killed_worker_group_resumes_from_the_reported_checkpoint(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(WORKTREE)}
    env.pop("XLA_FLAGS", None)  # the workers get their 4 devices from RayTrainer(worker_env=...)
    proc = subprocess.Popen([sys.executable, HERE / "ray_train.py", tmp_path, "--kill"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=400)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"the Ray run is still going after 400 s:\n{out[-4000:]}")
    assert proc.returncode == 0, out[-4000:]
    result = pickle.loads((tmp_path / "result.pkl").read_bytes())
    assert result["error"] is None and result["metrics"]["step"] == 16 and result["metrics"]["epoch"] == 3, result
    # the first group died in epoch 2 before writing anything; the second started from a reported epoch end
    attempts = sorted(tmp_path.glob("attempt_*.pkl"))
    assert len(attempts) == 1, attempts
    started = pickle.loads(attempts[0].read_bytes())
    assert started["resume"] and started["environment"] == "RayEnvironment"
    assert started["processes"] == 2 and started["devices"] == 8
    assert started["from_epoch"] in (1, 2) and started["from_step"] == 4 * started["from_epoch"], started
    assert len(list((tmp_path / "ray" / "fit").glob("checkpoint_*"))) >= 2  # Ray kept every reported save

    trainer = quiet_trainer(max_epochs=4, strategy="dp")  # uninterrupted, one process of 8 devices
    module = Regressor()
    trainer.fit(module, fj.DataLoader(regression_data(n=128), batch_size=32, shuffle=True, seed=1))
    # float32 sums over 2x4 devices in another order than over 8
    assert_trees_close(pickle.loads((tmp_path / "params.pkl").read_bytes()), module.variables[0],
                       rtol=1e-5, atol=1e-6)
