"""`SLURMEnvironment`: each `srun` task is one process; a batch script or `salloc` shell is one."""

from __future__ import annotations

import os
import re
import signal
import warnings

from fitjax.plugins.environments._base import ClusterEnvironment, env_int

__all__ = ["SLURMEnvironment", "first_host", "tasks_on_node"]


def first_host(nodelist: str) -> str:
    """The first host of a SLURM host list: `"gpu[003-004,9],cpu1"` -> `"gpu003"`."""
    match = re.match(r"([^,\[]*)(\[([^\]]*)\])?", nodelist.strip())
    prefix, ranges = match.group(1), match.group(3)
    if ranges is None:
        return prefix
    return prefix + re.split(r"[,-]", ranges)[0]


def tasks_on_node(tasks_per_node: str, node: int) -> int:
    """Node `node`'s entry of SLURM's compressed counts: `"2(x3),1"`, node 3 -> 1."""
    counts: list[int] = []
    for part in tasks_per_node.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if match is None:
            raise ValueError(f"cannot read the SLURM task counts {tasks_per_node!r} (expected e.g. '2(x3),1')")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts[min(node, len(counts) - 1)]


class SLURMEnvironment(ClusterEnvironment):
    """A SLURM job (Lightning's `SLURMEnvironment`): `srun` starts one process per task.

    World size, ranks and node counts come from the job step's variables (`SLURM_STEP_NUM_TASKS`
    / `SLURM_NTASKS`, `SLURM_PROCID`, `SLURM_LOCALID`, `SLURM_NODEID`); the coordinator is the
    first host of the step's node list on port `15000 + last 4 digits of SLURM_JOB_ID`
    (Lightning's rule), `MASTER_ADDR`/`MASTER_PORT` override them. A batch script or an
    `salloc` shell that runs python without `srun` is not a job step: it runs one process and
    warns how to start one per task.

    Args:
        auto_requeue: on `requeue_signal`, save a checkpoint and requeue the job
            (`scontrol requeue $SLURM_JOB_ID`), which then resumes from it.
        requeue_signal: the signal SLURM sends before the time limit
            (`#SBATCH --signal=B:USR1@120`).

    Example:
        >>> import signal
        >>> import fitjax as fj
        >>> env = fj.plugins.environments.SLURMEnvironment(requeue_signal=signal.SIGUSR1)
        >>> env.auto_requeue, env.requeue_signal.name
        (True, 'SIGUSR1')
        >>> # trainer = fj.Trainer(plugins=[env])   inside `srun python train.py`
    """

    variables = ("SLURM_JOB_ID", "SLURM_JOB_NAME", "SLURM_STEP_ID", "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS",
                 "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NNODES", "SLURM_STEP_NUM_NODES",
                 "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_STEP_NODELIST", "SLURM_NODELIST",
                 "MASTER_ADDR", "MASTER_PORT")

    def __init__(self, auto_requeue: bool = True, requeue_signal: signal.Signals | None = None, **timeouts):
        super().__init__(**timeouts)
        if not isinstance(auto_requeue, bool):
            raise ValueError(f"SLURMEnvironment(auto_requeue=...) must be True or False, got {auto_requeue!r}")
        requeue_signal = signal.SIGUSR1 if requeue_signal is None else requeue_signal
        if not isinstance(requeue_signal, int) or requeue_signal not in set(signal.Signals):
            raise ValueError(f"SLURMEnvironment(requeue_signal=...) must be a signal.Signals such as "
                             f"signal.SIGUSR1, got {requeue_signal!r}")
        self.auto_requeue = auto_requeue
        self.requeue_signal = signal.Signals(requeue_signal)

    @staticmethod
    def detect() -> bool:
        """True inside a SLURM job (its tasks, or its batch script / `salloc` shell)."""
        return "SLURM_NTASKS" in os.environ or "SLURM_JOB_ID" in os.environ

    @staticmethod
    def srun_used() -> bool:
        """True when `srun` started this process (a job step that is no interactive shell)."""
        in_step = "SLURM_STEP_ID" in os.environ or "SLURM_STEPID" in os.environ
        return in_step and os.environ.get("SLURM_JOB_NAME") not in ("bash", "interactive")

    @staticmethod
    def job_id() -> int | None:
        """`SLURM_JOB_ID` (None outside a job or in an interactive shell): the same across requeues."""
        if os.environ.get("SLURM_JOB_NAME") in ("bash", "interactive"):
            return None
        return env_int("SLURM_JOB_ID")

    @staticmethod
    def job_name() -> str | None:
        return os.environ.get("SLURM_JOB_NAME")

    @property
    def main_address(self) -> str:
        if os.environ.get("MASTER_ADDR"):
            return os.environ["MASTER_ADDR"]
        nodelist = os.environ.get("SLURM_STEP_NODELIST") or os.environ.get("SLURM_NODELIST") or "127.0.0.1"
        return first_host(nodelist)

    @property
    def main_port(self) -> int:
        port = env_int("MASTER_PORT")
        if port is not None:
            return port
        job = os.environ.get("SLURM_JOB_ID")
        return 15000 + int(job[-4:]) if job and job.isdigit() else 12910  # Lightning's numbers

    def world_size(self) -> int:
        if not self.srun_used():
            return 1
        return env_int("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS") or 1

    def global_rank(self) -> int:
        return (env_int("SLURM_PROCID") or 0) if self.srun_used() else 0

    def local_rank(self) -> int:
        return (env_int("SLURM_LOCALID") or 0) if self.srun_used() else 0

    def node_rank(self) -> int:
        return (env_int("SLURM_NODEID") or 0) if self.srun_used() else 0

    def num_nodes(self) -> int:
        if not self.srun_used():
            return 1
        return env_int("SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES") or 1

    def local_world_size(self) -> int:
        if not self.srun_used():
            return 1
        counts = os.environ.get("SLURM_STEP_TASKS_PER_NODE") or os.environ.get("SLURM_TASKS_PER_NODE")
        if counts:
            return tasks_on_node(counts, self.node_rank())
        return max(1, self.world_size() // self.num_nodes())

    def validate_settings(self, num_devices, num_nodes) -> None:
        tasks = env_int("SLURM_NTASKS") or 1
        if not self.srun_used() and tasks > 1:
            warnings.warn(
                f"SLURM job {os.environ.get('SLURM_JOB_ID')} has {tasks} tasks (SLURM_NTASKS={tasks}), but this "
                "process was not started by srun (a batch script or an salloc shell is no job step), so it "
                "runs alone: 1 process. To run one process per task, start it with srun: "
                "`srun python train.py ...` in the batch script.", stacklevel=3)
        super().validate_settings(num_devices, num_nodes)
