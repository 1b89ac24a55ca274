"""Preemption in the fit loop: the signals that stop a fit, what the agreed stop does, Lightning's
"hpc" checkpoint that a requeued SLURM job resumes from, and the requeue itself.

- SIGTERM: every process stops after one agreed step (`StopAgreement`, within a step or two of
  the signal); `trainer.received_sigterm` is True on all and `ModelCheckpoint` saves there.
- The requeue signal (SLURM with `auto_requeue`; SIGUSR1 by default): the same agreed stop, one
  checkpoint `<default_root_dir>/hpc_ckpt_<n>` saved by every process, then process 0 runs
  `scontrol requeue <job id>` once that save is complete on every process, as the last thing
  fit does (after the exception hooks, the loggers' finalisation and teardown). Lightning saves and
  requeues inside the signal handler; here the handler only records the request, since the
  state may be half-donated to a running step.
- SIGINT (Ctrl-C): Python's `KeyboardInterrupt` at once (fit's graceful shutdown follows,
  `fitjax.loop._interrupt`), except while a step holds the train state (its buffers donated, the
  new state not returned yet): then the loop stops after that step, raising `KeyboardInterrupt`
  once the new state is stored, so the exception hooks save the newest state. With several
  processes, always the agreed stop: every process raises `KeyboardInterrupt` after the same
  step (a Ctrl-C during validation waits for the next train step), so the shutdown's
  checkpoint is one collective save of one step. A second Ctrl-C before that raises at once (a
  step that never returns).
- A fit without `ckpt_path` resumes from the newest `hpc_ckpt_<n>` when it runs under SLURM
  (Lightning's rule: the requeued job runs the same script), and after a `fitjax launch
  --max-restarts` restart from the newest complete checkpoint ("last").
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

import jax

from fitjax import checkpoint
from fitjax.loop import _interrupt
from fitjax.loop._resume import Preempted
from fitjax.plugins.environments import SLURMEnvironment
from fitjax.strategies import StopAgreement, agree, broadcast_str

__all__ = ["RESTART_COUNT_VAR", "auto_resume_path", "requeue_job", "requeue_signal", "stop_on_signals", "stopped"]

log = logging.getLogger("fitjax")

HPC_PREFIX = "hpc_ckpt_"  # Lightning's name for the requeue checkpoint (a folder here)
REQUEUE = "requeue"
SIGINT = "SIGINT"
RESTART_COUNT_VAR = "FITJAX_RESTART_COUNT"  # set by `fitjax launch --max-restarts` in restarted processes


def requeue_signal(environment) -> signal.Signals | None:
    """The signal that asks for a requeue: `SLURMEnvironment(auto_requeue=True)`'s
    `requeue_signal`; None for every other environment."""
    if isinstance(environment, SLURMEnvironment) and environment.auto_requeue:
        return environment.requeue_signal
    return None


@contextlib.contextmanager
def stop_on_signals(environment, state: Callable[[], Any]) -> Iterator[StopAgreement]:
    """While fitting, SIGTERM (and the cluster `environment`'s requeue signal) ask every process
    to stop after an agreed step: yields the fit's `StopAgreement`. SIGINT raises
    `KeyboardInterrupt`, or asks for a stop after the step in flight when `state()` (the loop's
    train state) has been donated to it, and with several processes always asks for the agreed
    stop. The handlers only record the
    first request (a SIGTERM that SLURM sends after a requeue changes nothing): saving from a
    handler could meet the state half-donated to a running step. Installed from the main thread
    only (Python's rule); the previous handlers are restored after."""
    agreement = StopAgreement()
    several = jax.process_count() > 1
    reasons = {signal.SIGTERM: "SIGTERM"}
    requeue = requeue_signal(environment)
    if requeue is not None:
        reasons[requeue] = REQUEUE

    def handler(signum, frame):
        agreement.request(reasons[signum])  # the first request stands
        checkpoint.writer().signalled(reasons[signum])  # a save waiting on a stalled store gives up

    def on_sigint(signum, frame):
        if agreement.requested != SIGINT and (several or checkpoint.is_donated(state())):
            # the step in flight returns the newest state: stop after it; with several processes
            # always after an agreed step, since a process raising alone leaves the others
            # waiting for it in a collective (the launcher's Ctrl-C reaches each at its own step)
            agreement.request(SIGINT)
            return
        _interrupt.on_sigint(signum, frame)

    checkpoint.writer().signalled(None)

    handlers = {sig: handler for sig in reasons}
    if _interrupt.listening():  # a process that ignores SIGINT keeps ignoring it
        handlers[signal.SIGINT] = on_sigint
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.signal(sig, handle) for sig, handle in handlers.items()}
    try:
        yield agreement
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
        agreement.close()


def stopped(trainer, reason: str) -> tuple[BaseException, Path | None]:
    """What the agreed stop does before fit returns: the exception the loop raises, and for the
    requeue signal the hpc checkpoint saved now (fit requeues the job when it is done,
    `requeue_job`). SIGTERM's save is the checkpoint callbacks' (`trainer.received_sigterm`);
    a deferred Ctrl-C is `KeyboardInterrupt` (fit's graceful shutdown, `_interrupt`)."""
    if reason == SIGINT:
        return KeyboardInterrupt(), None
    saved = save_hpc_checkpoint(trainer) if reason == REQUEUE else None
    return Preempted(f"{reason} received; stopped after step {trainer.global_step}"), saved


# ------------------------------------------------------------------------------ hpc checkpoint

def _hpc_versions(folder: Path) -> list[int]:
    if not folder.is_dir():
        return []
    found = (re.fullmatch(rf"{HPC_PREFIX}(\d+)", p.name) for p in folder.iterdir())
    return sorted(int(m.group(1)) for m in found if m)


def hpc_resume_path(trainer) -> Path | None:
    """The newest complete `hpc_ckpt_<n>` in `default_root_dir` (Lightning's `_hpc_resume_path`)."""
    folder = checkpoint.local_path(trainer.default_root_dir)
    for n in reversed(_hpc_versions(folder)):
        if checkpoint.is_checkpoint(folder / f"{HPC_PREFIX}{n}"):
            return folder / f"{HPC_PREFIX}{n}"
    return None


def save_hpc_checkpoint(trainer) -> Path:
    """Saves `<default_root_dir>/hpc_ckpt_<n+1>` (n: the newest there, Lightning's numbering)
    on every process and returns once every process's part is written."""
    folder = checkpoint.local_path(trainer.default_root_dir)
    versions = _hpc_versions(folder)
    path = Path(broadcast_str(str(folder / f"{HPC_PREFIX}{(versions[-1] if versions else 0) + 1}")))
    trainer.save_checkpoint(path)
    agree(True)  # a barrier: every process's save is complete before anyone requeues
    if trainer.is_global_zero:
        log.info("fitjax: saved %s for the requeued job to resume from", path)
    return path


def requeue_job(saved: Path) -> None:
    """Process 0 runs `scontrol requeue <job id>`, at the very end of fit (callbacks' exception
    hooks, loggers and teardown done); SLURM then sends SIGTERM and ends this job (so nothing of
    fit's own work is left to race it) and starts it again."""
    if jax.process_index() != 0:
        return
    array_job = os.environ.get("SLURM_ARRAY_JOB_ID")
    job_id = f"{array_job}_{os.environ['SLURM_ARRAY_TASK_ID']}" if array_job else os.environ.get("SLURM_JOB_ID")
    if not job_id or not re.fullmatch(r"[0-9_]+", job_id):
        log.warning("fitjax: the requeue signal arrived outside a SLURM job (SLURM_JOB_ID=%r); %s is "
                    "saved, nothing requeued", job_id, saved)
        return
    try:
        result = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        log.warning("fitjax: requeuing SLURM job %s failed: %s (the checkpoint %s is saved)", job_id, error, saved)
        return
    if result.returncode == 0:
        log.info("fitjax: requeued SLURM job %s", job_id)
    else:
        log.warning("fitjax: `scontrol requeue %s` failed with status %d: %s (the checkpoint %s is saved)",
                    job_id, result.returncode, (result.stdout + result.stderr).strip(), saved)


# ------------------------------------------------------------------------------ resuming

def auto_resume_path(trainer, ckpt_path: Any) -> Any:
    """`Trainer.fit(ckpt_path=...)` after Lightning's automatic choices: "hpc" is the newest
    hpc checkpoint; None under SLURM is the newest hpc checkpoint when there is one (the
    requeued job resumes with no change to its script), and None in a process `fitjax launch`
    restarted is "last" when a checkpoint exists. Anything else is returned as given."""
    if ckpt_path == "hpc":
        found = hpc_resume_path(trainer)
        if found is None:
            raise FileNotFoundError(
                f"Trainer.fit(ckpt_path='hpc') found no complete {HPC_PREFIX}<n> checkpoint in "
                f"{str(checkpoint.local_path(trainer.default_root_dir))!r} (Trainer(default_root_dir=...)).")
        return found
    if ckpt_path is not None:
        return ckpt_path
    if SLURMEnvironment.detect():  # Lightning's test: inside a SLURM job, whichever environment runs
        found = hpc_resume_path(trainer)
        if found is not None:
            if trainer.is_global_zero:
                log.info("fitjax: resuming from %s (a requeued SLURM job)", found)
            return found
    if int(os.environ.get(RESTART_COUNT_VAR) or 0) > 0 and trainer.checkpoint_callbacks:
        found = trainer.checkpoint_callbacks[0].find("last", trainer)
        if found is not None and trainer.is_global_zero:
            log.info("fitjax: restart %s of `fitjax launch`: resuming from %s",
                     os.environ[RESTART_COUNT_VAR], found)
        return found
    return None
