"""`fitjax launch --nproc N script.py ...`: N processes of one script on this machine, as one JAX job.

Each process gets what `Trainer(num_nodes=...)` reads (`fitjax.strategies.initialize_distributed`):
`JAX_COORDINATOR_ADDRESS=127.0.0.1:<port>`, `JAX_NUM_PROCESSES=N`, `JAX_PROCESS_ID=i` (and
`LOCAL_RANK=i`, `LOCAL_WORLD_SIZE=N`: one machine, `fj.plugins.environments.LightningEnvironment`), and with
`--devices-per-process K` K virtual CPU devices (`XLA_FLAGS=--xla_force_host_platform_device_count=K`,
`JAX_PLATFORMS=cpu`). Output lines are prefixed with the rank. When a process fails, the others are
killed at once (SIGKILL, as Lightning's launcher does: a process that lost a peer waits in a
collective and cannot finish, and jax.distributed traps SIGTERM to sync a preemption, which would
wait for the dead peer too) and `launch` exits with the failed process's status. SIGINT and SIGTERM
are forwarded to every process (fitjax saves a checkpoint on SIGTERM and returns from `fit`; on
Ctrl-C every process stops after one agreed step, saves one checkpoint and exits with status 130,
and the others get 30 s to end after the first such exit; one that comes while they start reaches
them once they can end quietly); a second one kills them. With `--max-restarts R`, a failure (an exit with a non-zero status, a
kill, a `Watchdog`'s exit) stops the rest and starts all N processes again, up to R times
(torchrun's elastic restarts; a forwarded signal is not retried). The restarted processes get
`FITJAX_RESTART_COUNT` (1, 2, ...), and `Trainer.fit()` without `ckpt_path` then resumes from the
newest complete checkpoint, so the script needs no change.

On a cluster, start the script with the cluster's own launcher instead (`srun python script.py`
under SLURM, torchrun, mpirun): `fj.plugins.environments` reads what each one sets.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import IO

from fitjax.loop import RESTART_COUNT_VAR  # read by Trainer.fit: resume from "last"

__all__ = ["launch"]

_POLL_S = 0.05  # how often the processes are checked: bounds the delay before a failure stops the rest
_DEVICE_FLAG = "--xla_force_host_platform_device_count"
_INTERRUPTED = (130, -signal.SIGINT)  # Ctrl-C ended it: fitjax's status, or Python's default handler
_INTERRUPT_GRACE_S = 30.0  # the others' time to finish their shutdown after one such exit
# What a normal run prints that says nothing to its user, dropped from the output: Gloo's (the CPU
# collectives') note that each process reached its peers. Its errors and everything else pass.
_NOISE = re.compile(rb"^\[Gloo\] Rank \d+ is connected to \d+ peer ranks\. Expected number of connected peer "
                    rb"ranks is : \d+\r?\n?$")


_VALUED = ("--nproc", "--devices-per-process", "--port", "--max-restarts")  # launcher options that take a value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fitjax launch",
        usage="fitjax launch --nproc N [--devices-per-process K] [--port P] [--max-restarts R] "
              "(script.py | -m module) [args ...]",
        description="Start N processes of a script on this machine as one jax.distributed job "
                    "(coordinator on 127.0.0.1). Each process's output lines are prefixed with its rank.",
    )
    parser.add_argument("--nproc", type=int, required=True, help="number of processes to start")
    parser.add_argument("--devices-per-process", type=int, default=None, metavar="K",
                        help="give each process K virtual CPU devices (sets XLA_FLAGS and JAX_PLATFORMS=cpu)")
    parser.add_argument("--port", type=int, default=None,
                        help="the coordinator's port on 127.0.0.1 (default: a free one)")
    parser.add_argument("--max-restarts", type=int, default=0, metavar="R",
                        help="after a process fails, stop the rest and start all N again, up to R times; "
                             "Trainer.fit resumes from the newest checkpoint (FITJAX_RESTART_COUNT is set)")
    return parser


def _split(argv: list[str]) -> tuple[list[str], list[str]]:
    """(launcher options, the script or `-m module` and its arguments): the first word that is not
    a launcher option starts the command, so the script's own options are left alone."""
    i = 0
    while i < len(argv) and argv[i].startswith("-") and argv[i] != "-m":
        i += 2 if argv[i] in _VALUED else 1
    return argv[:i], argv[i:]


def launch(argv: list[str] | None = None) -> int:
    """Runs `fitjax launch` with `argv` (the arguments after `launch`); returns the exit status.

    Example:
        >>> # shell: fitjax launch --nproc 2 --devices-per-process 4 train.py fit --config c.yaml
    """
    parser = _parser()
    options, command = _split(list(sys.argv[1:] if argv is None else argv))
    opts = parser.parse_args(options)
    if opts.nproc < 1:
        parser.error(f"--nproc must be a positive int, got {opts.nproc!r}")
    if opts.devices_per_process is not None and opts.devices_per_process < 1:
        parser.error(f"--devices-per-process must be a positive int, got {opts.devices_per_process!r}")
    if opts.max_restarts < 0:
        parser.error(f"--max-restarts must be an int >= 0, got {opts.max_restarts!r}")
    if not command or command == ["-m"]:
        parser.error("give the script to run (`train.py ...`) or a module (`-m mypkg.train ...`)")
    if command[0] != "-m" and not os.path.exists(command[0]):
        parser.error(f"script {command[0]!r} not found (working directory {os.getcwd()!r})")
    # Through _run.py, by path: a failing script ends its process at once (see there), and no
    # package is imported before the script (JAX reads its JAX_* variables when first imported).
    command = [sys.executable, "-u", os.path.join(os.path.dirname(os.path.abspath(__file__)), "_run.py"), *command]
    for restart in range(opts.max_restarts + 1):
        # a fresh port each time: the failed coordinator's may still be held
        group = _Group(command, opts.nproc, opts.port or _free_port(), opts.devices_per_process, restart=restart)
        status = group.run()
        if status != 0 and not group.signals and opts.max_restarts and restart == opts.max_restarts:
            group._say(f"failed again (status {status}) and no restart is left (--max-restarts "
                       f"{opts.max_restarts} used up): giving up")
        if status == 0 or group.signals or restart == opts.max_restarts:
            return status  # done, stopped by the user (a forwarded signal), or out of restarts
        group._say(f"restarting all {opts.nproc} processes (restart {restart + 1} of {opts.max_restarts})")
    return status


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(rank: int, nproc: int, port: int, devices: int | None, restart: int = 0) -> dict[str, str]:
    env = dict(os.environ)
    env.update(JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES=str(nproc),
               JAX_PROCESS_ID=str(rank), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(nproc),  # one machine
               PYTHONUNBUFFERED="1", **{RESTART_COUNT_VAR: str(restart)})
    for name in ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "GROUP_RANK", "RANK", "WORLD_SIZE"):
        env.pop(name, None)  # another launcher's settings would disagree with these
    if devices is not None:
        flags = re.sub(rf"{_DEVICE_FLAG}=\S*", "", env.get("XLA_FLAGS", "")).strip()
        env["XLA_FLAGS"] = f"{flags} {_DEVICE_FLAG}={devices}".strip()
        env["JAX_PLATFORMS"] = "cpu"
    return env


def _die_with_parent() -> None:
    """Runs in each child before exec: its own process group (we forward signals ourselves), SIGINT
    blocked until `_run.py` unblocks it, and on Linux a SIGKILL when the launcher dies, so a killed
    launcher leaves no process behind."""
    os.setpgid(0, 0)
    # Ctrl-C waits (blocked, not lost) until `_run.py` is ready to end it quietly: one that lands
    # while Python starts would print a traceback of its imports and exit 1
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


class _Group:
    """The N processes, the threads copying their output, and the rule for stopping them."""

    def __init__(self, command: list[str], nproc: int, port: int, devices: int | None, restart: int = 0):
        self.command, self.nproc, self.port, self.devices = command, nproc, port, devices
        self.restart = restart
        self.procs: list[subprocess.Popen] = []
        self.signals = 0
        self.started = False  # every process started: a signal is forwarded at once
        self.pending: int | None = None  # a signal that came before, forwarded once they are
        self.lock = threading.Lock()

    def run(self) -> int:
        previous = {sig: signal.signal(sig, self._forward) for sig in (signal.SIGINT, signal.SIGTERM)}
        readers = []
        try:
            devices = f", {self.devices} CPU devices each" if self.devices else ""
            self._say(f"{self.nproc} processes, coordinator 127.0.0.1:{self.port}{devices}")
            # all children first: preexec_fn runs between fork and exec, safest with no threads yet
            for rank in range(self.nproc):
                self.procs.append(subprocess.Popen(
                    self.command, env=_env(rank, self.nproc, self.port, self.devices, self.restart),
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent))
            self.started = True
            if self.pending is not None:  # a signal while they were started: each gets it now
                for proc in self.procs:
                    _signal_group(proc, self.pending)
            for rank, proc in enumerate(self.procs):
                reader = threading.Thread(target=self._copy, args=(rank, proc.stdout), daemon=True)
                reader.start()
                readers.append(reader)
            status = self._wait()
        finally:
            self._kill_all()  # only processes still running (after an error in the launcher itself)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        for reader in readers:
            reader.join(timeout=2.0)
        return status

    def _wait(self) -> int:
        """Waits for every process; at the first failure kills the rest. Returns the exit status.
        A process that Ctrl-C ended (status 130) is not a failure of the others: they stop after
        the same step and save one checkpoint together (`fitjax.loop._preemption`), so they get
        `_INTERRUPT_GRACE_S` to finish before they are killed."""
        interrupted_at = None
        while True:
            codes = [proc.poll() for proc in self.procs]
            if any(code in _INTERRUPTED for code in codes) and interrupted_at is None:
                interrupted_at = time.monotonic()
            failed = [(rank, code) for rank, code in enumerate(codes) if code not in (None, 0, *_INTERRUPTED)]
            if interrupted_at is not None and not failed and None in codes:
                if time.monotonic() - interrupted_at < _INTERRUPT_GRACE_S:
                    time.sleep(_POLL_S)
                    continue
                failed = [(rank, code) for rank, code in enumerate(codes) if code in _INTERRUPTED]
            if failed:
                rank, code = failed[0]
                running = [r for r, c in enumerate(codes) if c is None]
                stopping = f"; stopping ranks {running}" if running else ""
                self._say(f"rank {rank} exited with status {_describe(code)}{stopping}")
                self._kill_all()
                return _status(code)
            if None not in codes:
                return _status(next((code for code in codes if code != 0), 0))
            time.sleep(_POLL_S)

    def _forward(self, signum: int, frame) -> None:
        self.signals += 1
        if self.signals > 1:  # a second Ctrl-C: do not wait for a graceful stop
            self._kill_all()
            return
        if not self.started:
            self.pending = signum
            return
        for proc in self.procs:
            if proc.poll() is None:
                _signal_group(proc, signum)

    def _kill_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                _signal_group(proc, signal.SIGKILL)
        for proc in self.procs:
            try:
                proc.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                pass

    def _copy(self, rank: int, stream: IO[bytes]) -> None:
        prefix = f"[rank {rank}] ".encode()
        out = sys.stdout.buffer
        for line in iter(stream.readline, b""):
            if _NOISE.match(line):
                continue
            with self.lock:
                out.write(prefix + line if line.endswith(b"\n") else prefix + line + b"\n")
                out.flush()
        stream.close()

    def _say(self, message: str) -> None:
        with self.lock:
            sys.stderr.write(f"[fitjax launch] {message}\n")
            sys.stderr.flush()


def _signal_group(proc: subprocess.Popen, signum: int) -> None:
    try:
        os.killpg(proc.pid, signum)  # the child and anything it started
    except (ProcessLookupError, PermissionError):
        pass


def _status(code: int) -> int:
    return 128 - code if code < 0 else code  # killed by signal s: 128 + s, as a shell reports it


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"{128 - code} (killed by {signal.Signals(-code).name})"
        except ValueError:
            return str(128 - code)
    return str(code)
