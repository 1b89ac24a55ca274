"""`LightningEnvironment`: processes described by plain variables (`fitjax launch`, by hand, JobSet)."""

from __future__ import annotations

import os

from fitjax.plugins.environments._base import ClusterEnvironment, env_int

__all__ = ["LightningEnvironment"]

_JAX_VARS = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")


def _split_host_port(address: str) -> tuple[str, int | None]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        return address, None
    return host.strip("[]"), int(port)


class LightningEnvironment(ClusterEnvironment):
    """The default: what `fitjax launch` sets, or variables set by hand on each machine.

    Reads `JAX_COORDINATOR_ADDRESS`, `JAX_NUM_PROCESSES`, `JAX_PROCESS_ID` (JAX's own names,
    which `fitjax launch` sets), else Lightning's `MASTER_ADDR`/`MASTER_PORT`, `WORLD_SIZE`,
    `RANK`, `NODE_RANK`; `LOCAL_RANK`/`LOCAL_WORLD_SIZE` say how many processes share a machine
    (default 1). Without a count, `Trainer(num_nodes=N)` sets it: one process per machine.
    Nothing set: one process.

    Example:
        >>> import fitjax as fj
        >>> # shell, on each of 2 machines: JAX_COORDINATOR_ADDRESS=host0:1234 JAX_PROCESS_ID=<0|1> python train.py
        >>> trainer = fj.Trainer(num_nodes=1, plugins=[fj.plugins.environments.LightningEnvironment()])
    """

    variables = (*_JAX_VARS, "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "NODE_RANK", "GROUP_RANK",
                 "LOCAL_RANK", "LOCAL_WORLD_SIZE")

    def __init__(self, **timeouts):
        super().__init__(**timeouts)
        self._world_size = 1
        self._global_rank = 0

    @staticmethod
    def detect() -> bool:
        """Always True: the environment of last resort (Lightning's too)."""
        return True

    @staticmethod
    def explicitly_set() -> bool:
        """True when `JAX_NUM_PROCESSES` or `JAX_PROCESS_ID` is set: read before any cluster's
        variables (a `fitjax launch` inside a SLURM job step is still `fitjax launch`)."""
        return any(os.environ.get(name) for name in _JAX_VARS[1:])

    @property
    def creates_processes_externally(self) -> bool:
        return self.world_size() > 1

    @property
    def main_address(self) -> str:
        if os.environ.get("JAX_COORDINATOR_ADDRESS"):
            return _split_host_port(os.environ["JAX_COORDINATOR_ADDRESS"])[0]
        return os.environ.get("MASTER_ADDR") or "127.0.0.1"

    @property
    def main_port(self) -> int | None:
        if os.environ.get("JAX_COORDINATOR_ADDRESS"):
            return _split_host_port(os.environ["JAX_COORDINATOR_ADDRESS"])[1]
        return env_int("MASTER_PORT")

    def coordinator_address(self) -> str | None:
        # JAX's variable is passed as given (a name JAX resolves, a port it needs)
        return os.environ.get("JAX_COORDINATOR_ADDRESS") or super().coordinator_address()

    def world_size(self) -> int:
        size = env_int("JAX_NUM_PROCESSES", "WORLD_SIZE")
        return self._world_size if size is None else size

    def set_world_size(self, size: int) -> None:
        """Used when no variable gives the count: `Trainer(num_nodes=N)` x processes per machine."""
        self._world_size = size

    def global_rank(self) -> int:
        rank = env_int("JAX_PROCESS_ID", "RANK")
        if rank is not None:
            return rank
        node = env_int("NODE_RANK", "GROUP_RANK")
        if node is not None:
            return node * self.local_world_size() + self.local_rank()
        return self._global_rank

    def set_global_rank(self, rank: int) -> None:
        self._global_rank = rank

    def local_rank(self) -> int:
        return env_int("LOCAL_RANK") or 0

    def local_world_size(self) -> int:
        return env_int("LOCAL_WORLD_SIZE") or 1

    def node_rank(self) -> int:
        node = env_int("NODE_RANK", "GROUP_RANK")
        return self.global_rank() // self.local_world_size() if node is None else node
