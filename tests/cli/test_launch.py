"""`fitjax launch`: real processes on 127.0.0.1 through the console command (`python -m fitjax.cli`)."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest
import launch_ctrl_c
from cli_parts import LAUNCH_COMMON, LAUNCH_RUNS, Regressor, RegressorData, swa_fit
from helpers import assert_trees_close

import fitjax as fj
from fitjax import checkpoint
from fitjax.cli import LightningCLI, _run, launch
from fitjax.loop import _interrupt

HERE = Path(__file__).resolve().parent
WORKTREE = HERE.parents[1]


def start_launch(*args, cwd) -> subprocess.Popen:
    # XLA_FLAGS keeps conftest's 8 devices: --devices-per-process must replace that count.
    # Every program into the run's compile cache (conftest's FITJAX_COMPILE_CACHE), not only those
    # over fitjax's 1 s: the launches of the same script (and the same fit in several scripts)
    # load their steps instead of compiling them again in each process
    env = {**os.environ, "PYTHONPATH": str(WORKTREE), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    return subprocess.Popen([sys.executable, "-m", "fitjax.cli", "launch", *map(str, args)], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen, timeout: float) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail(f"fitjax launch still running after {timeout} s:\n{out[-4000:]}")
    return out


def assert_gone(pid: int) -> None:
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_two_launched_processes_of_4_devices_match_one_process_of_8(tmp_path):
    proc = start_launch("--nproc", 2, "--devices-per-process", 4, HERE / "launch_fit.py", tmp_path, cwd=tmp_path)
    out = finish(proc, timeout=400)
    assert proc.returncode == 0, out[-4000:]
    assert "[rank 0] process 0 of 2, 4 devices" in out and "[rank 1] process 1 of 2, 4 devices" in out
    assert "[rank 0] Epoch 1 done" in out and "[rank 1] Epoch" not in out  # process 0 draws progress
    launched = pickle.loads((tmp_path / "params.pkl").read_bytes())
    for name in LAUNCH_RUNS:  # one run, one log dir: its config written once, by process 0
        assert [p.name for p in (tmp_path / name / "fitjax_logs").iterdir()] == ["version_0"]
        assert (tmp_path / name / "fitjax_logs" / "version_0" / "config.yaml").exists()
    # Trainer(profiler="jax"): each process's trace in its own folder (JAX names the file after the host)
    traces = [list((tmp_path / "dp" / "fitjax_logs" / "version_0" / f"process_{rank}" / "plugins" / "profile")
                   .glob("*/*.xplane.pb")) for rank in range(2)]
    assert [len(t) for t in traces] == [1, 1], traces
    for name, args in LAUNCH_RUNS.items():
        assert launched[name]["processes"] == 2 and launched[name]["devices"] == 8
        # the reference's numbers only: without the profiler, which costs its trace and changes none
        reference_args = [arg for arg in args if arg != "--trainer.profiler=jax"]
        single = LightningCLI(Regressor, RegressorData, save_config_callback=None, args=[
            "fit", *reference_args, *LAUNCH_COMMON, "--trainer.logger=false", "--trainer.enable_progress_bar=false",
            f"--trainer.default_root_dir={tmp_path / 'single' / name}"])
        assert len(single.trainer.devices) == 8
        assert_trees_close(launched[name]["params"], single.model.variables[0], rtol=1e-5, atol=1e-6)


def test_swa_with_batchnorm_over_two_processes_matches_one_process(tmp_path):
    # the average and the statistics' pass over the train data, every process on its shard
    proc = start_launch("--nproc", 2, "--devices-per-process", 4, HERE / "launch_swa.py", tmp_path, cwd=tmp_path)
    out = finish(proc, timeout=300)
    assert proc.returncode == 0, out[-4000:]
    launched = pickle.loads((tmp_path / "swa.pkl").read_bytes())
    # float32 sums over 2x4 devices in another order than over 8: measured differences <= 2.4e-7
    assert_trees_close(launched, [np.asarray(x) for x in jax.tree.leaves(swa_fit())], rtol=1e-5, atol=1e-6)


def test_stateful_metrics_of_two_launched_processes_equal_one_processs(tmp_path):
    """Macro F1 and AUROC under `fitjax launch`: each process logs the numbers one process of 8
    devices logs (their states merged over both processes), and the validation rows the two
    processes' `validation_step_outputs` got are every example once (the last batch partial)."""
    proc = start_launch("--nproc", 2, "--devices-per-process", 4, HERE / "launch_metrics.py", tmp_path, cwd=tmp_path)
    out = finish(proc, timeout=300)
    assert proc.returncode == 0, out[-4000:]
    launched = [pickle.loads((tmp_path / f"metrics_{rank}.pkl").read_bytes()) for rank in range(2)]
    if str(HERE.parent / "strategies") not in sys.path:  # the module and data of tests/strategies' 2-process run
        sys.path.insert(0, str(HERE.parent / "strategies"))
    from multiprocess_data import fit_metrics

    one = fit_metrics(fj.Trainer(max_epochs=2, strategy="dp", logger=False, enable_progress_bar=False,
                                 enable_model_summary=False, enable_checkpointing=False, num_sanity_val_steps=0))
    assert set(one["logged"]) == {"train_f1", "val_f1", "val_auroc"}
    for got in launched:
        assert got["logged"] == pytest.approx(one["logged"], rel=1e-6)
    for epoch in range(2):
        both = np.concatenate([got["rows"][epoch] for got in launched])
        np.testing.assert_array_equal(np.sort(both), np.sort(one["rows"][epoch]))


def test_a_failing_process_stops_the_others_within_10_s(tmp_path):
    proc = start_launch("--nproc", 2, "--devices-per-process", 1, HERE / "launch_fail.py", tmp_path, cwd=tmp_path)
    out = finish(proc, timeout=120)
    ended = time.time()
    assert proc.returncode == 1, out[-4000:]
    assert "[rank 1] RuntimeError: rank 1 fails on purpose" in out
    assert "rank 1 exited with status 1; stopping ranks [0]" in out
    assert ended - float((tmp_path / "raised_at").read_text()) < 10.0
    for rank in range(2):  # rank 0 was waiting for rank 1 in a collective: killed, not left behind
        assert_gone(int((tmp_path / f"pid_{rank}").read_text()))


def wait_for_files(proc: subprocess.Popen, paths: list[Path], timeout: float) -> None:
    deadline = time.time() + timeout
    while not all(path.exists() for path in paths):
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            pytest.fail(f"waiting for {paths}: {proc.communicate()[0][-4000:]}")
        time.sleep(0.1)


@pytest.mark.parametrize("signalled", ["launcher", "rank 1 only"])
def test_sigterm_reaches_every_process_and_fit_saves_at_one_agreed_step(tmp_path, signalled):
    # each process sees the signal at its own step: they agree on one step within a few steps
    # (not at a log step), stop after it and save one checkpoint together (a process the signal
    # missed stops too)
    proc = start_launch("--nproc", 2, "--devices-per-process", 2, HERE / "launch_preempt.py", tmp_path, cwd=tmp_path)
    wait_for_files(proc, [tmp_path / f"training_{rank}" for rank in range(2)], timeout=300)
    if signalled == "launcher":  # forwarded to both
        proc.send_signal(signal.SIGTERM)
    else:
        os.kill(int((tmp_path / "pid_1").read_text()), signal.SIGTERM)
    out = finish(proc, timeout=60)
    assert proc.returncode == 0, out[-4000:]  # a preempted fit returns: every process exits cleanly
    results = [json.loads((tmp_path / f"result_{rank}.json").read_text()) for rank in range(2)]
    same = ("received_sigterm", "step", "saved")
    assert [{k: r[k] for k in same} for r in results[1:]] == [{k: results[0][k] for k in same}]
    assert results[0]["received_sigterm"] is True
    # agreed within steps of the signal (log steps are 10_000 apart): a few steps of the
    # key-value exchange, the checkpoint save after it not counted
    signalled_at, seen_time = results[1]["seen_at"]
    assert 0 <= results[1]["step"] - signalled_at <= 20, results
    print(f"stopped {results[1]['step'] - signalled_at} steps after the signal was seen")
    saved = Path(results[0]["saved"])
    assert saved.name.endswith(f"step={results[0]['step']}") and (saved / "commit_success.txt").exists()


def test_sigint_reaches_every_process(tmp_path):
    proc = start_launch("--nproc", 2, HERE / "launch_signal.py", tmp_path, cwd=tmp_path)
    wait_for_files(proc, [tmp_path / f"ready_{rank}" for rank in range(2)], timeout=60)
    proc.send_signal(signal.SIGINT)
    out = finish(proc, timeout=30)
    assert proc.returncode == 130, out[-4000:]  # KeyboardInterrupt in the processes
    # outside a fit too: Lightning's line once (process 0), no traceback
    assert out.count("Detected KeyboardInterrupt, attempting graceful shutdown ...") == 1, out[-4000:]
    assert "Traceback" not in out, out[-4000:]
    assert (_run.MESSAGE, _run.DEBUG_VAR) == (_interrupt.MESSAGE, _interrupt.DEBUG_VAR)  # restated there
    for rank in range(2):
        assert_gone(int((tmp_path / f"pid_{rank}").read_text()))


def test_launch_rejects_bad_arguments_naming_them(tmp_path, capsys):
    for args, message in [(["--nproc", "0", "script.py"], "--nproc must be a positive int, got 0"),
                          (["--nproc", "2", str(tmp_path / "missing.py")], "missing.py' not found"),
                          (["--nproc", "2", "--max-restarts", "-1", "script.py"],
                           "--max-restarts must be an int >= 0, got -1")]:
        with pytest.raises(SystemExit) as exited:
            launch(args)
        assert exited.value.code == 2 and message in capsys.readouterr().err


def test_watchdog_names_the_rank_that_hangs_and_ends_the_job_within_its_timeout(tmp_path):
    # rank 1 sleeps in a hook; rank 0 soon waits for it in a collective: no step ends on either
    proc = start_launch("--nproc", 2, "--devices-per-process", 1, HERE / "launch_hang.py", tmp_path, cwd=tmp_path)
    out = finish(proc, timeout=300)
    ended = time.time()
    assert proc.returncode == 1, out[-4000:]
    assert ended - float((tmp_path / "hang_at").read_text()) < 3 + 10, out[-4000:]  # timeout + 10 s
    for rank in range(2):  # every process says who it is, where the others stood, and its stacks
        assert f"[rank {rank}] fitjax watchdog: rank {rank} of 2 (pid {(tmp_path / f'pid_{rank}').read_text()})" in out
        assert_gone(int((tmp_path / f"pid_{rank}").read_text()))
    assert "behind: rank [1]" in out, out[-4000:]
    hung = [line for line in out.splitlines() if line.startswith("[rank 1]")]
    assert any("in on_train_batch_end" in line for line in hung), "\n".join(hung[-40:])  # the sleeping hook
    assert any("Current thread" in line or "Thread 0x" in line for line in hung)


def test_max_restarts_after_kill_9_resumes_from_the_last_checkpoint_and_ends_as_an_uninterrupted_run(tmp_path):
    proc = start_launch("--nproc", 2, "--devices-per-process", 1, "--max-restarts", 1, HERE / "launch_restart.py",
                        tmp_path, cwd=tmp_path)
    wait_for_files(proc, [tmp_path / "ready", tmp_path / "pid_1_0"], timeout=300)
    os.kill(int((tmp_path / "pid_1_0").read_text()), signal.SIGKILL)
    out = finish(proc, timeout=300)
    assert proc.returncode == 0, out[-4000:]
    assert "rank 1 exited with status 137 (killed by SIGKILL); stopping ranks [0]" in out
    assert "restarting all 2 processes (restart 1 of 1)" in out
    result = pickle.loads((tmp_path / "params.pkl").read_bytes())
    assert result["restart"] == 1 and result["step"] == 16
    assert result["resumed_at"] >= 4 and result["resumed_at"] % 4 == 0, result["resumed_at"]  # not from scratch
    for resumed, reference in zip(result["params"], result["reference"], strict=True):
        np.testing.assert_array_equal(resumed, reference)  # bitwise: the same processes, devices and steps


def test_a_failure_after_the_last_restart_says_the_restarts_are_used_up(tmp_path):
    script = tmp_path / "fail.py"
    script.write_text("import sys\nsys.exit(3)\n")
    proc = start_launch("--nproc", 1, "--max-restarts", 1, script, cwd=tmp_path)
    out = finish(proc, timeout=120)
    assert proc.returncode == 3, out[-3000:]
    assert "restarting all 1 processes (restart 1 of 1)" in out
    assert "failed again (status 3) and no restart is left (--max-restarts 1 used up): giving up" in out


class _ResumedAt(fj.Callback):
    def on_train_start(self, trainer, module):
        self.step = trainer.global_step


def test_ctrl_c_at_the_launcher_ends_every_process_after_one_step_with_one_checkpoint(tmp_path):
    # a terminal's Ctrl-C reaches the launcher (the processes have process groups of their own)
    proc = start_launch("--nproc", 2, "--devices-per-process", 1, HERE / "launch_ctrl_c.py", tmp_path, cwd=tmp_path)
    wait_for_files(proc, [tmp_path / f"training_{rank}" for rank in range(2)], timeout=120)
    proc.send_signal(signal.SIGINT)
    out = finish(proc, timeout=60)
    assert proc.returncode == 130, out[-4000:]
    assert out.count("Detected KeyboardInterrupt, attempting graceful shutdown ...") == 1, out[-4000:]  # process 0
    assert "Traceback" not in out and "[Gloo]" not in out and "exited with status" not in out, out[-4000:]
    stopped = {int((tmp_path / f"stopped_{rank}").read_text()) for rank in range(2)}
    assert len(stopped) == 1, stopped  # one agreed step on both
    step = stopped.pop()
    saved = sorted((tmp_path / "checkpoints").iterdir())
    assert [p.name for p in saved] == [f"epoch={(step - 1) // 4}-step={step}"], saved  # 4 steps an epoch
    assert checkpoint.is_checkpoint(saved[0])

    resumed_at = _ResumedAt()
    trainer = launch_ctrl_c.trainer(tmp_path, devices=2, max_steps=step + 1, callbacks=[resumed_at],
                                    enable_progress_bar=False)
    trainer.fit(Regressor(), RegressorData().train_dataloader(), ckpt_path="last")
    assert resumed_at.step == step and trainer.global_step == step + 1
