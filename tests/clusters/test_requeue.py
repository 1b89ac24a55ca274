"""SLURM's requeue signal on the fixture cluster: one checkpoint, `scontrol requeue`, and a resumed
job that ends with an uninterrupted run's parameters, bitwise (Lightning's auto-requeue, whose
"hpc" checkpoint the same script finds when the job runs again)."""

from __future__ import annotations

import json
import pickle
import time
from pathlib import Path

import numpy as np
import pytest

from fitjax import checkpoint

HERE = Path(__file__).resolve().parent
WORKTREE = HERE.parents[1]


def wait_for(paths: list[Path], slurm, job: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not all(p.exists() for p in paths):
        state = slurm.job(job).get("JobState")
        if state not in ("PENDING", "RUNNING", "CONFIGURING") or time.monotonic() > deadline:
            pytest.fail(f"job {job} {state} before {paths} appeared:\n{slurm.output(job)[-4000:]}")
        time.sleep(0.2)


def test_usr1_saves_one_checkpoint_requeues_and_the_job_resumes_to_the_uninterrupted_result(slurm, tmp_path):
    script = f"#!/bin/bash\n#SBATCH --ntasks=2\n#SBATCH --requeue\nsrun python {HERE / 'slurm_requeue.py'} {tmp_path}\n"
    job = slurm.sbatch(script, env={"PYTHONPATH": str(WORKTREE)})
    wait_for([tmp_path / f"training_{rank}" for rank in range(2)], slurm, job, timeout=300)
    slurm.run("scancel", "--signal=USR1", job)  # to every task of the job's steps, as --signal=USR1@T does
    info = slurm.wait(job, timeout=400)
    out = slurm.output(job)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", out[-4000:]
    assert info["Restarts"] == "1", info  # requeued once, by process 0 after the save
    assert f"requeued SLURM job {job}" in out, out[-4000:]

    stopped = [json.loads((tmp_path / f"stopped_{rank}.json").read_text()) for rank in range(2)]
    assert stopped[0] == stopped[1] and 3 <= stopped[0]["step"] < 16, stopped  # one agreed step
    assert stopped[0]["received_sigterm"] is False  # the requeue signal, not a SIGTERM stop
    saved = sorted(p.name for p in (tmp_path / "run").iterdir())
    assert saved == ["hpc_ckpt_1"] and checkpoint.is_checkpoint(tmp_path / "run" / "hpc_ckpt_1"), saved  # one
    assert checkpoint.read_meta(tmp_path / "run" / "hpc_ckpt_1")["global_step"] == stopped[0]["step"]

    final = pickle.loads((tmp_path / "final.pkl").read_bytes())
    assert final["restart"] == 1 and final["resumed_at"] == stopped[0]["step"] and final["step"] == 16
    for resumed, reference in zip(final["params"], final["reference"], strict=True):
        np.testing.assert_array_equal(resumed, reference)
