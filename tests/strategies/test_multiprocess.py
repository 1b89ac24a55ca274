"""A real 2-process run through jax.distributed on localhost (4 CPU devices each, gloo collectives)
against the same run in one process on 8 devices."""

from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import LossHistory, Regressor, assert_trees_close, quiet_trainer
from multiprocess_data import STRATEGIES, classification_data, fit_and_predict, fit_metrics


HERE = Path(__file__).resolve().parent
WORKTREE = HERE.parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    """Starts both processes, waits for them (killing both on a hang), returns their results."""
    out = tmp_path_factory.mktemp("two_processes")
    port = _free_port()
    procs = []
    for i in range(2):
        env = {**os.environ, "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}", "JAX_PROCESS_ID": str(i),
               "PYTHONPATH": os.pathsep.join([str(WORKTREE), str(HERE)])}
        env.pop("XLA_FLAGS", None)  # the worker sets its own 4 devices
        log = open(out / f"stdout_{i}.txt", "w")
        procs.append(subprocess.Popen([sys.executable, str(HERE / "multiprocess_worker.py"), str(out)],
                                      env=env, stdout=log, stderr=subprocess.STDOUT, cwd=out))
    try:
        for p in procs:
            p.wait(timeout=240)
    finally:
        for p in procs:  # SIGKILL: jax.distributed catches SIGTERM to sync a preemption
            if p.poll() is None:
                p.kill()
    for i, p in enumerate(procs):
        assert p.returncode == 0, (out / f"stdout_{i}.txt").read_text()[-4000:]
    results = [pickle.loads((out / f"process_{i}.pkl").read_bytes()) for i in range(2)]
    return out, [p.pid for p in procs], results, [(out / f"stdout_{i}.txt").read_text() for i in range(2)]


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_two_processes_match_one_process_on_8_devices(two_processes, name):
    _, _, results, _ = two_processes
    history = LossHistory()
    trainer = quiet_trainer(max_epochs=2, strategy=STRATEGIES[name](), callbacks=[history], log_every_n_steps=2)
    module = Regressor()
    predictions, val, several = fit_and_predict(trainer, module)
    for got in results:  # every process saw the same global numbers
        run = got[name]
        np.testing.assert_allclose(run["losses"], history.losses, rtol=1e-5, atol=1e-6)
        assert_trees_close(run["params"], module.variables[0], rtol=1e-5, atol=1e-6)
        for key in ("val/loss", "val/mae", "train/loss_epoch"):
            assert run["val"][key] == pytest.approx(val[key], rel=1e-5)
        assert run["several"] == [pytest.approx(loader, rel=1e-5) for loader in several]
        assert run["several"][0]["val/loss/dataloader_idx_0"] == pytest.approx(val["val/loss"], rel=1e-5)
        # every example once, in input order, on each process (77 = 4×16 + 13 split 8 + 5)
        assert run["predictions"].shape == (77, 1)
        np.testing.assert_allclose(run["predictions"], predictions, rtol=1e-5, atol=1e-6)
    expected_spec = "P(None, 'fsdp')" if name == "fsdp" else "P()"
    assert results[0][name]["kernel_spec"] == expected_spec


def test_stateful_metrics_of_two_processes_equal_one_processs(two_processes):
    """F1 (macro, logged from `training_step` and `validation_step`) and AUROC: their states are
    merged over the 8 devices of both processes, so each process logs the numbers one process
    logs; each process's `validation_step_outputs` gets its own real rows of every batch (the
    last has 4 examples), together every validation example once."""
    _, _, results, _ = two_processes
    one = fit_metrics(quiet_trainer(max_epochs=2, strategy="dp", num_sanity_val_steps=0))
    assert set(one["logged"]) == {"train_f1", "val_f1", "val_auroc"}
    assert 0.2 < one["logged"]["val_f1"] < 1.0 and 0.5 < one["logged"]["val_auroc"] < 1.0
    for got in results:
        assert got["metrics"]["logged"] == pytest.approx(one["logged"], rel=1e-6)
    everything = classification_data(100, 5)["x"][:, 0]
    for epoch in range(2):
        np.testing.assert_array_equal(one["rows"][epoch], everything)
        both = np.concatenate([got["metrics"]["rows"][epoch] for got in results])
        np.testing.assert_array_equal(np.sort(both), np.sort(everything))


def test_only_process_zero_writes_logs_and_progress(two_processes):
    out, pids, results, stdouts = two_processes
    for name in STRATEGIES:
        events = list((out / "logs" / name / "version_0").glob("events.out.tfevents.*"))
        # fit's file and the later validate's, both written by process 0
        assert events and all(e.name.split(".")[-2] == str(pids[0]) for e in events), events
    assert "Epoch 1 done" in stdouts[0]
    assert "Epoch" not in stdouts[1]


def test_a_flag_raised_on_one_process_is_agreed_by_all(two_processes):
    _, _, results, _ = two_processes
    assert [r["agree"] for r in results] == [[True, False], [True, False]]


def test_a_stop_asked_on_one_process_is_obeyed_by_all_at_the_next_sync_point(two_processes):
    """`trainer.should_stop` set on process 1 only at step 3 is compared at the next log step
    (log_every_n_steps=2): both processes stop after step 4, with `should_stop` True."""
    _, _, results, _ = two_processes
    assert [r["stopped"] for r in results] == [(4, True), (4, True)]
