"""Ctrl-C during a real fit in a terminal (a pty): at each phase, Lightning's one line and no
traceback, exit status 130, and a complete newest checkpoint from which `ckpt_path="last"`
resumes to the same parameters, bit for bit, as a fit that was never interrupted. Before the
fit (`import fitjax`, the script's set-up), and repeated while the program exits: status 130, no
traceback.

The fits run in their own processes (`ctrl_c_fit.py`), all at once; each sends SIGINT to itself
at its phase. The uninterrupted fit and the resumed ones run here.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import gc
import os
import pty
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import jax
import numpy as np
import pytest

import fitjax as fj
from fitjax import checkpoint

import ctrl_c_fit
from ctrl_c_fit import Model, data
from helpers import sigint_as

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
LINE = "Detected KeyboardInterrupt, attempting graceful shutdown ..."
PHASES = ["compile", "step", "validation", "save"]


class _Terminal:
    """`ctrl_c_fit.py PHASE` in a pty of its own; `finish()` returns (status, output)."""

    def __init__(self, out: Path, phase: str):
        leader, follower = pty.openpty()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE)]), "COLUMNS": "80", "LINES": "24"}
        env.pop("FITJAX_DEBUG", None)
        command = [sys.executable, ctrl_c_fit.__file__, str(out), phase]
        if phase == "compile":  # the console command, with --debug
            command = [sys.executable, "-m", "fitjax.cli", "fit", "--debug", "--model.class_path=ctrl_c_fit.Model",
                       "--data.class_path=ctrl_c_fit.Data", "--trainer.callbacks+=ctrl_c_fit.SendCtrlC",
                       "--trainer.callbacks.init_args.phase=compile", "--trainer.devices=1",
                       f"--trainer.default_root_dir={out}"]
        self.proc = subprocess.Popen(sigint_as("SIG_DFL", command), stdin=follower, stdout=follower,
                                     stderr=follower, env=env, cwd=out, start_new_session=True)
        os.close(follower)
        self._chunks: list[bytes] = []
        self._reader = threading.Thread(target=self._read, args=(leader,), daemon=True)
        self._reader.start()

    def _read(self, fd: int) -> None:
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: the process and its terminal are gone
                break
            if not chunk:
                break
            self._chunks.append(chunk)
        os.close(fd)

    def finish(self, timeout: float = 240) -> tuple[int, str]:
        try:
            status = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        self._reader.join(timeout=10)
        return status, b"".join(self._chunks).decode(errors="replace")


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory):
    """Every phase's interrupted fit, run at once: {phase: (folder, status, output)}."""
    runs = {}
    for phase in PHASES:
        out = tmp_path_factory.mktemp(phase)
        runs[phase] = (out, _Terminal(out, phase))
    return {phase: (out, *terminal.finish()) for phase, (out, terminal) in runs.items()}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    trainer = ctrl_c_fit.trainer(tmp_path_factory.mktemp("whole"), enable_progress_bar=False)
    trainer.fit(Model(), *data())
    return jax.device_get(trainer.state.params), trainer.global_step


def _checkpoints(out: Path) -> list[Path]:
    return sorted(out.rglob("checkpoints/*"))


def _assert_one_line(status: int, output: str, phase: str, *, traceback: bool = False) -> None:
    assert status == 130, f"{phase}: status {status}\n{output[-3000:]}"
    assert output.count(LINE) == 1, output[-3000:]
    assert ("Traceback" in output) == traceback and ("KeyboardInterrupt\r\n" in output) == traceback, output[-3000:]
    assert "fit returned" not in output


@pytest.mark.parametrize("phase", ["step", "validation", "save"])
def test_ctrl_c_saves_the_newest_state_and_last_resumes_it_bitwise(phase, interrupted, uninterrupted):
    out, status, output = interrupted[phase]
    _assert_one_line(status, output, phase)
    saved = _checkpoints(out)
    assert len(saved) == 1 and checkpoint.is_checkpoint(saved[0]), saved  # complete, and the newest only
    step = int(saved[0].name.split("step=")[1])
    if phase == "step":  # the callback's count includes a run of the step at build time (XLA:CPU's choice)
        assert ctrl_c_fit.STEP_SIGNALLED - 1 <= step <= ctrl_c_fit.STEP_SIGNALLED, saved
    else:
        assert step == {"validation": 16, "save": 8}[phase], saved

    resumed = ctrl_c_fit.trainer(out, enable_progress_bar=False)
    resumed.fit(Model(), *data(), ckpt_path="last")
    params, global_step = uninterrupted
    assert resumed.global_step == global_step
    for a, b in zip(jax.tree.leaves(jax.device_get(resumed.state.params)), jax.tree.leaves(params)):
        np.testing.assert_array_equal(a, b)


def test_fitjax_fit_ctrl_c_while_compiling_ends_with_status_130_and_debug_s_traceback(interrupted):
    out, status, output = interrupted["compile"]
    _assert_one_line(status, output, "compile", traceback=True)  # --debug: the traceback too
    assert _checkpoints(out) == []  # no step ran: nothing newer than what was there


def test_a_second_ctrl_c_during_the_shutdown_save_says_it_is_saving(interrupted):
    out, status, output = interrupted["save"]
    assert "Still shutting down: saving the checkpoint" in output, output[-3000:]


@pytest.fixture
def sigint_as_in_a_script():
    """SIGINT in this process as a script run from a terminal has it (Python's KeyboardInterrupt),
    whatever the suite was started with: a background job passes it on ignored, and fit then
    rightly leaves it ignored (`test_a_script_started_with_ctrl_c_ignored_...`)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


class _CtrlCInGarbageCollection(fj.Callback):
    """Sends Ctrl-C from inside a garbage-collector callback (JAX has one: where a Ctrl-C
    during set-up was lost, printed as "Exception ignored", in 1 of 7 tries)."""

    def on_train_start(self, trainer, module):
        sent = []

        def send(phase, info):
            if not sent:
                sent.append(phase)
                os.kill(os.getpid(), signal.SIGINT)

        gc.callbacks.append(send)
        try:
            gc.collect()
        finally:
            gc.callbacks.remove(send)


@pytest.mark.usefixtures("sigint_as_in_a_script")
def test_a_ctrl_c_from_a_garbage_collector_callback_is_not_lost_and_fit_raises_interrupted(tmp_path):
    trainer = ctrl_c_fit.trainer(tmp_path, callbacks=[_CtrlCInGarbageCollection()], enable_progress_bar=False,
                                 enable_model_summary=False)
    handler = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt) as caught:  # what code catching Ctrl-C around fit sees
        trainer.fit(Model(), *data())
    assert isinstance(caught.value, SystemExit) and caught.value.code == 130  # the program ends quietly
    assert trainer.interrupted and trainer.global_step == 0  # Lightning's flag; stopped before a step
    assert signal.getsignal(signal.SIGINT) is handler  # Python's own handler is back


class _CtrlCInEvaluation(fj.Callback):
    def on_validation_batch_start(self, trainer, module, batch, batch_idx, dataloader_idx=0):
        os.kill(os.getpid(), signal.SIGINT)

    def on_predict_batch_start(self, trainer, module, batch, batch_idx, dataloader_idx=0):
        os.kill(os.getpid(), signal.SIGINT)


@pytest.mark.filterwarnings("ignore:.*never fitted nor loaded")
@pytest.mark.usefixtures("sigint_as_in_a_script")
def test_ctrl_c_in_validate_and_predict_ends_them_as_fit_does(tmp_path):
    """Lightning handles Ctrl-C the same way in every stage: its line, then the program ends."""
    trainer = ctrl_c_fit.trainer(tmp_path, callbacks=[_CtrlCInEvaluation()], enable_progress_bar=False,
                                 enable_model_summary=False)
    for stage in (trainer.validate, trainer.predict):
        with pytest.raises(KeyboardInterrupt) as caught:
            stage(Model(), data()[1])
        assert isinstance(caught.value, SystemExit) and caught.value.code == 130, stage


def _script_with_ctrl_c(after: str, delay: float, *, repeat: bool,
                        sigint: str = "SIG_DFL") -> tuple[int, str, str]:
    """`python ctrl_c_script.py`, started with SIGINT's handler `sigint`, sent SIGINT `delay`
    seconds after it printed a line starting with `after` (and then every 50 ms until it ends,
    with `repeat`): (status, stdout, stderr)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("FITJAX_DEBUG", None)
    proc = subprocess.Popen(sigint_as(sigint, [sys.executable, str(HERE / "ctrl_c_script.py")]),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    seen = []
    while not seen or not seen[-1].startswith(after):
        seen.append(proc.stdout.readline())
        assert seen[-1], f"ended before {after!r}: {proc.communicate()}"
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    while repeat and proc.poll() is None:
        time.sleep(0.05)
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    return proc.returncode, "".join(seen) + out, err


def test_ctrl_c_before_fit_and_again_while_exiting_ends_the_script_with_130_and_no_traceback():
    # 0.5 s into the script: in `import fitjax` (JAX's import, where a Ctrl-C landed in JAX's
    # garbage-collection callback and was lost); and from 0.5 s after the fit's first line on
    # (compiling), every 50 ms through its shutdown and the program's exit (where one landed in
    # JAX's `atexit` clean-up: a traceback, and status -2)
    # and 0.3 s into the set-up, a loop of small arrays and `gc.collect()`: the Ctrl-C lands in
    # JAX's collection callback, where it waits; resent from a thread it was starved (the loop is
    # almost always collecting) and lost 11 times in 16, so the script trained to the end
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        early = pool.submit(_script_with_ctrl_c, "importing", 0.5, repeat=False)
        again = pool.submit(_script_with_ctrl_c, "fitjax: ", 0.5, repeat=True)
        setup = pool.submit(_script_with_ctrl_c, "setting up", 0.3, repeat=False)
    for name, (status, out, err) in (("early", early.result()), ("repeated", again.result()),
                                     ("set-up", setup.result())):
        assert status == 130, f"{name}: status {status}\n{out}\n{err[-3000:]}"
        assert "Traceback" not in err and "Exception ignored" not in err, f"{name}: {err[-3000:]}"
        assert "trained to the end" not in out, f"{name}: {out}"
    assert "set up" not in early.result()[1]  # it ended at its import
    assert "set up" not in setup.result()[1]  # and during its set-up
    assert again.result()[1].count(LINE) == 1  # the fit's line, once


def test_a_script_started_with_ctrl_c_ignored_trains_to_the_end_through_every_ctrl_c():
    # `nohup python train.py`, or `python train.py &` in a shell script: SIGINT ignored from the
    # start, as the user (or the shell) asked; fit and its signal handling take no handler back
    status, out, err = _script_with_ctrl_c("fitjax: ", 0.2, repeat=True, sigint="SIG_IGN")
    assert status == 0, f"status {status}\n{out}\n{err[-3000:]}"
    assert "trained to the end" in out and LINE not in out + err, out + err[-3000:]
