"""Real runs under each cluster engine, started by the tests: srun and sbatch on the fixture
SLURM cluster, torchrun, mpirun, against `fitjax launch --nproc 2` and one process of 8 devices.

Every 2-process run is `cluster_worker.py` (2 processes x 4 CPU devices, gloo, dp and fsdp): the
same program, so the same topology gives the same bits whichever engine started it.
"""

from __future__ import annotations

import os
import pickle
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from helpers import Regressor, assert_trees_close, quiet_trainer, regression_data
from slurm_cluster import free_port

import fitjax as fj

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "strategies"))
from multiprocess_data import STRATEGIES  # noqa: E402

HERE = Path(__file__).resolve().parent
WORKTREE = HERE.parents[1]
WORKER = HERE / "cluster_worker.py"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_", "PMI", "JAX_"))}
    env.update(PYTHONPATH=str(WORKTREE), **extra)
    if os.geteuid() == 0:  # Open MPI refuses root without these (CI runs as root)
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return env


def run(cmd: list[str], out: Path, env: dict[str, str], timeout: float = 300) -> str:
    """Runs an engine's command in its own process group; kills the group on a hang."""
    proc = subprocess.Popen([str(c) for c in cmd], cwd=out, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        text, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        text, _ = proc.communicate()
        pytest.fail(f"{cmd[0]} still running after {timeout} s:\n{text[-4000:]}")
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} exited {proc.returncode}:\n{text[-4000:]}"
    return text


def results(out: Path) -> list[dict]:
    return [pickle.loads((out / f"process_{rank}.pkl").read_bytes()) for rank in range(2)]


def assert_same_bits(got: dict, expected: dict) -> None:
    for name in STRATEGIES:
        for a, b in zip(jax.tree.leaves(got[name]), jax.tree.leaves(expected[name])):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=name)


def assert_environment(got: list[dict], kind: str) -> None:
    for rank, process in enumerate(got):
        assert process["environment"] == {
            "type": kind, "world_size": 2, "global_rank": rank, "local_rank": rank, "node_rank": 0, "num_nodes": 1,
            "process_index": rank, "process_count": 2, "local_devices": 4, "devices": 8}
        assert process["devices_error"].startswith("Trainer(devices=4) but each machine of this run has 8 devices: "
                                                   f"2 processes of 4 devices ({kind}: ")


@pytest.fixture(scope="module")
def launched(tmp_path_factory) -> list[dict]:
    """`fitjax launch --nproc 2 --devices-per-process 4 cluster_worker.py`: the baseline."""
    out = tmp_path_factory.mktemp("launch")
    run([sys.executable, "-m", "fitjax.cli", "launch", "--nproc", 2, "--devices-per-process", 4, WORKER, out],
        out, _env())
    return results(out)


def test_fitjax_launch_matches_one_process_of_8_devices(launched):
    assert_environment(launched, "LightningEnvironment")
    for name, strategy in STRATEGIES.items():
        trainer = quiet_trainer(max_epochs=2, strategy=strategy())
        module = Regressor()
        trainer.fit(module, fj.DataLoader(regression_data(n=128), batch_size=32, shuffle=True, seed=1))
        assert len(trainer.devices) == 8
        # float32 sums over 2x4 devices in another order than over 8
        assert_trees_close(launched[0][name], module.variables[0], rtol=1e-5, atol=1e-6)
        assert_same_bits(launched[1], launched[0])


def test_srun_two_tasks_match_fitjax_launch(slurm, launched, tmp_path):
    text = slurm.srun("-n", 2, sys.executable, WORKER, tmp_path, cwd=tmp_path, env={"PYTHONPATH": str(WORKTREE)}).stdout
    got = results(tmp_path)
    assert_environment(got, "SLURMEnvironment")
    assert "SLURM_STEP_NUM_TASKS='2'" in got[0]["devices_error"]
    for process in got:
        assert_same_bits(process, launched[0])
    # the banner of each fit, from process 0 only
    assert text.count("8/8 devices used, 2 processes (SLURMEnvironment, rank 0)\n  strategy") == 2, text[-3000:]


def test_sbatch_without_srun_runs_one_process_and_says_how_to_run_more(slurm, tmp_path):
    job = slurm.sbatch(f"#!/bin/bash\n#SBATCH --ntasks=2\n{sys.executable} {WORKER} {tmp_path} dp\n",
                       cwd=tmp_path, env={"PYTHONPATH": str(WORKTREE)})
    info = slurm.wait(job, timeout=300)
    text = slurm.output(job)
    assert info["JobState"] == "COMPLETED", text[-4000:]
    assert "has 2 tasks (SLURM_NTASKS=2), but this process was not started by srun" in text
    assert "`srun python train.py ...`" in text
    assert "4/4 devices used, 1 process (SLURMEnvironment, rank 0)\n  strategy DataParallel" in text
    process = pickle.loads((tmp_path / "process_0.pkl").read_bytes())
    assert process["environment"]["world_size"] == 1 and process["environment"]["process_count"] == 1


@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torch's torchrun is not installed (dev extra)")
def test_torchrun_with_node_rank_exported_matches_fitjax_launch(launched, tmp_path):
    # NODE_RANK=0 is what Lightning's docs have users export; it must not become every process's rank
    run(["torchrun", "--nproc_per_node", 2, "--master_addr", "127.0.0.1", "--master_port", free_port(next_too=True),
         WORKER, tmp_path], tmp_path, _env(NODE_RANK="0"))
    got = results(tmp_path)
    assert_environment(got, "TorchElasticEnvironment")
    for process in got:
        assert_same_bits(process, launched[0])


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI is not installed (apt-get install openmpi-bin)")
def test_mpirun_matches_fitjax_launch(launched, tmp_path):
    # the coordinator on loopback: Open MPI's launcher URI names this machine's first interface
    run(["mpirun", "-np", 2, "-x", "MASTER_ADDR=127.0.0.1", "-x", f"MASTER_PORT={free_port()}",
         "-x", "PYTHONPATH", sys.executable, WORKER, tmp_path], tmp_path, _env())
    got = results(tmp_path)
    assert_environment(got, "MPIEnvironment")
    for process in got:
        assert_same_bits(process, launched[0])
