"""A real one-node SLURM cluster on localhost for the tests: `munged`, `slurmctld` and `slurmd`.

Debian's `slurm-wlm` and `munge` packages (`.ci/run` installs them). Everything the daemons
write (munge key and socket, state, spool, logs, job output) lives in one folder; the ports are
picked free, so several test runs on one machine each get their own cluster. The daemons run as
the current user (root on CI), and so do the jobs.
"""

from __future__ import annotations

import getpass
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
# Terminal states of `scontrol show job` (a requeued job passes through REQUEUED/PENDING instead).
FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
            "PREEMPTED"}


def missing_binaries() -> list[str]:
    return [name for name in (*DAEMONS, "srun", "sbatch", "sinfo", "scontrol") if shutil.which(name) is None]


def free_port(*, next_too: bool = False) -> int:
    """A port free on loopback; `next_too`: one whose next port is free too (torchrun's agent
    holds MASTER_PORT and JAX's coordinator then listens on MASTER_PORT + 1)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if not next_too:
            return port
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port


class SlurmCluster:
    """A started cluster: run its commands with `env`, submit jobs, read their output.

    Example (inside a test that takes the `slurm` fixture):
        >>> out = slurm.srun("-n", "2", "hostname")           # doctest: +SKIP
        >>> job = slurm.sbatch("#!/bin/bash\\necho hi\\n")     # doctest: +SKIP
        >>> slurm.wait(job)["JobState"], slurm.output(job)     # doctest: +SKIP
        ('COMPLETED', 'hi\\n')
    """

    def __init__(self, root: Path):
        self.root = Path(root)
        self.conf = self.root / "slurm.conf"
        self.jobs_dir = self.root / "jobs"
        self.node = socket.gethostname()
        self.cpus = os.cpu_count() or 1
        self._procs: dict[str, subprocess.Popen] = {}

    # -- what a test uses -------------------------------------------------------------------------

    @property
    def env(self) -> dict[str, str]:
        """The test's environment without any outer SLURM job's variables, plus this cluster's config."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        env["SLURM_CONF"] = str(self.conf)
        return env

    def run(self, *args: str, timeout: float = 120, check: bool = True, env: dict | None = None,
            **kwargs) -> subprocess.CompletedProcess:
        """Runs a SLURM command (`srun`, `scontrol`, ...) against this cluster; stdout and stderr merged."""
        proc = subprocess.run([str(a) for a in args], env={**self.env, **(env or {})}, timeout=timeout,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kwargs)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(map(str, args))} exited {proc.returncode}:\n{proc.stdout[-4000:]}"
                                 f"\n{self.logs()}")
        return proc

    def srun(self, *args: str, timeout: float = 300, **kwargs) -> subprocess.CompletedProcess:
        """`srun ARGS` in the foreground: the job step's merged output in `.stdout`."""
        return self.run("srun", "--quit-on-interrupt", *args, timeout=timeout, **kwargs)

    def sbatch(self, script: str | Path, *args: str, cwd: str | Path | None = None,
               env: dict | None = None) -> str:
        """Submits a batch script (its text or a path); returns the job id.

        Output goes to `output(job_id)` (appended across requeues, so a requeued job's two runs
        are both there).
        """
        self.jobs_dir.mkdir(exist_ok=True)
        if not isinstance(script, Path):
            path = self.jobs_dir / f"script_{time.monotonic_ns()}.sh"
            path.write_text(script)
            script = path
        proc = self.run("sbatch", "--parsable", "--open-mode=append", f"--output={self.jobs_dir}/%j.out",
                        *args, script, cwd=cwd or self.root, env=env)
        return proc.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` as a dict (`JobState`, `ExitCode`, `Restarts`, ...)."""
        text = self.run("scontrol", "show", "job", "-o", job_id).stdout
        return dict(re.findall(r"(\w+)=(\S*)", text))

    def wait(self, job_id: str, timeout: float = 300) -> dict[str, str]:
        """Waits until the job has finished (after any requeues); returns its `job` record."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = self.job(job_id)
            if info.get("JobState") in FINISHED:
                return info
            time.sleep(0.5)
        self.run("scancel", job_id, check=False)
        raise AssertionError(f"job {job_id} still {self.job(job_id).get('JobState')} after {timeout} s:\n"
                             f"{self.output(job_id)[-4000:]}\n{self.logs()}")

    def output(self, job_id: str) -> str:
        path = self.jobs_dir / f"{job_id}.out"
        return path.read_text() if path.exists() else ""

    def logs(self, tail: int = 2000) -> str:
        """The daemons' log tails, for failure messages."""
        parts = []
        for path in sorted((self.root / "log").glob("*")):
            parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-tail:]}")
        return "\n".join(parts)

    # -- start and stop ---------------------------------------------------------------------------

    def start(self, timeout: float = 60) -> "SlurmCluster":
        for sub in ("munge", "state", "spool", "log", "jobs"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o600)
        self.munge_socket = self.root / "munge" / "munge.socket"
        plugstack = self.root / "plugstack.conf"  # empty: the system's plug-ins stay out
        plugstack.write_text("")
        self._write_conf(plugstack)
        log = self.root / "log"
        self._spawn("munged", ["munged", "--foreground", "--force", f"--socket={self.munge_socket}",
                               f"--key-file={key}", f"--pid-file={self.root / 'munge' / 'munged.pid'}",
                               f"--seed-file={self.root / 'munge' / 'munged.seed'}",
                               f"--log-file={log / 'munged.log'}"])
        self._wait_for(lambda: self.munge_socket.exists(), "munged's socket", timeout)
        self._spawn("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])
        self._spawn("slurmd", ["slurmd", "-D", "-f", str(self.conf), "-N", self.node])
        self._wait_for(self._idle, f"sinfo to show node {self.node} idle", timeout)
        return self

    def stop(self) -> None:
        """Cancels what still runs, then stops the daemons (SIGTERM, then SIGKILL after 10 s)."""
        if "slurmctld" in self._procs and self._procs["slurmctld"].poll() is None:
            self.run("scancel", "--full", f"--user={getpass.getuser()}", check=False, timeout=30)
            self._wait_for(lambda: not self.run("squeue", "-h", check=False, timeout=30).stdout.strip(),
                           "the queue to empty", 30, fail=False)
        for name in reversed(DAEMONS):
            proc = self._procs.pop(name, None)
            if proc is None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def _write_conf(self, plugstack: Path) -> None:
        # A random first job id: Lightning's coordinator port is 15000 + the job id's last 4
        # digits, so two test runs' clusters on one machine do not pick the same ports.
        # cred_expire also delays a requeued job's restart (120 s by default) and the scheduler
        # passes every second instead of every minute: a requeued job runs again in ~6 s.
        user, root = getpass.getuser(), self.root
        self.conf.write_text(f"""\
ClusterName=fitjaxtest
FirstJobId={random.randrange(10_000, 90_000)}
SlurmctldHost={self.node}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser={user}
SlurmdUser={user}
AuthType=auth/munge
AuthInfo=socket={self.munge_socket},cred_expire=5
CredType=cred/munge
StateSaveLocation={root / 'state'}
SlurmdSpoolDir={root / 'spool'}
SlurmctldPidFile={root / 'slurmctld.pid'}
SlurmdPidFile={root / 'slurmd.pid'}
SlurmctldLogFile={root / 'log' / 'slurmctld.log'}
SlurmdLogFile={root / 'log' / 'slurmd.log'}
PlugStackConfig={plugstack}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1,bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
JobRequeue=1
MinJobAge=600
KillWait=10
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
""")

    def _spawn(self, name: str, cmd: list[str]) -> None:
        out = open(self.root / "log" / f"{name}.out", "wb")
        self._procs[name] = subprocess.Popen(cmd, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                             start_new_session=True)  # a Ctrl-C of pytest reaches it via stop()
        out.close()

    def _idle(self) -> bool:
        for name, proc in self._procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited {proc.returncode} while starting:\n{self.logs()}")
        states = self.run("sinfo", "-h", "-o", "%T", check=False, timeout=30).stdout.split()
        return states == ["idle"]

    def _wait_for(self, ready, what: str, timeout: float, fail: bool = True) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():
                return
            time.sleep(0.2)
        if fail:
            self.stop()
            raise RuntimeError(f"timed out after {timeout} s waiting for {what}:\n{self.logs()}")
