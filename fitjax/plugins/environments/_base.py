"""`ClusterEnvironment`: what a launcher says about this process, in Lightning's shape.

An environment only reads: world size, global rank, local rank, node rank, the coordinator and
the local devices, from the variables its launcher sets. `fitjax.strategies.initialize_distributed`
hands those numbers to `jax.distributed.initialize`.
"""

from __future__ import annotations

import abc
import os
from typing import Sequence

__all__ = ["ClusterEnvironment", "env_int"]


def env_int(*names: str) -> int | None:
    """The first of `names` set in the environment, as an int (None when none is set)."""
    for name in names:
        value = os.environ.get(name)
        if value is not None and value.strip() != "":
            try:
                return int(value)
            except ValueError:
                raise ValueError(
                    f"the environment variable {name}={value!r} must be an integer; it is set by "
                    "the launcher (unset it, or start the script with the launcher that sets it)"
                ) from None
    return None


class ClusterEnvironment(abc.ABC):
    """Where this process stands among the processes of one run (Lightning's `ClusterEnvironment`).

    `world_size()` processes run on `num_nodes()` machines, `local_world_size()` on each; this
    one is `global_rank()` (its JAX process index), `local_rank()` on its machine, which is
    `node_rank()`. `coordinator_address()` is process 0's `host:port`, `local_device_ids()` the
    accelerators this process drives (None: all it sees).

    Args:
        initialization_timeout: seconds `jax.distributed.initialize` waits for every process.
        heartbeat_timeout: seconds without a heartbeat before JAX declares a process dead.
        shutdown_timeout: seconds the shutdown barrier waits for the other processes.

    Example:
        >>> import fitjax as fj
        >>> env = fj.plugins.environments.LightningEnvironment()
        >>> env.world_size(), env.global_rank()      # nothing launched: one process
        (1, 0)
    """

    #: the variables this environment reads, named in its error messages
    variables: Sequence[str] = ()

    def __init__(self, *, initialization_timeout: int = 300, heartbeat_timeout: int = 100,
                 shutdown_timeout: int = 300):
        for name, value in (("initialization_timeout", initialization_timeout),
                            ("heartbeat_timeout", heartbeat_timeout), ("shutdown_timeout", shutdown_timeout)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{type(self).__name__}({name}=...) must be a positive int of seconds, "
                                 f"got {value!r}")
        self.timeouts = {"initialization_timeout": initialization_timeout,
                         "heartbeat_timeout_seconds": heartbeat_timeout,
                         "shutdown_timeout_seconds": shutdown_timeout}

    # -- Lightning's members ----------------------------------------------------------------------

    @property
    def creates_processes_externally(self) -> bool:
        """True: a launcher started every process (fitjax never spawns them itself)."""
        return True

    @property
    @abc.abstractmethod
    def main_address(self) -> str | None:
        """Process 0's host (None: JAX finds it)."""

    @property
    @abc.abstractmethod
    def main_port(self) -> int | None:
        """The coordinator's port on `main_address`."""

    @staticmethod
    @abc.abstractmethod
    def detect() -> bool:
        """True when this process was started by this environment's launcher."""

    @abc.abstractmethod
    def world_size(self) -> int:
        """The number of processes of the run."""

    def set_world_size(self, size: int) -> None:
        """Ignored: the launcher decides (Lightning's environments do the same)."""

    @abc.abstractmethod
    def global_rank(self) -> int:
        """This process's index among all (JAX's `process_index`)."""

    def set_global_rank(self, rank: int) -> None:
        """Ignored: the launcher decides."""

    @abc.abstractmethod
    def local_rank(self) -> int:
        """This process's index among those on its machine."""

    @abc.abstractmethod
    def node_rank(self) -> int:
        """The index of this process's machine."""

    def validate_settings(self, num_devices: int | str, num_nodes: int | None) -> None:
        """Raises when `Trainer(num_nodes=, devices=)` contradict what the launcher started.

        `num_nodes` counts machines; an int `devices` counts the devices of one machine (with
        several processes per machine, each driving one accelerator, that is the processes per
        machine: Lightning's meaning). `devices` is checked once JAX runs (see
        `fitjax.strategies.initialize_distributed`).
        """
        if num_nodes is not None and num_nodes != self.num_nodes():
            raise ValueError(
                f"Trainer(num_nodes={num_nodes}) but {type(self).__name__} runs {self.world_size()} "
                f"process{'es' if self.world_size() != 1 else ''} on {self.num_nodes()} "
                f"node{'s' if self.num_nodes() != 1 else ''} ({self.describe_variables()}). num_nodes counts "
                f"machines, as in Lightning: pass num_nodes={self.num_nodes()}, or leave it unset to take "
                "the launcher's count."
            )

    def teardown(self) -> None:
        """Nothing to clean up: the environment only reads."""

    # -- fitjax's ---------------------------------------------------------------------------------

    def local_world_size(self) -> int:
        """Processes per machine (1 unless the launcher says more)."""
        return 1

    def num_nodes(self) -> int:
        """Machines in the run: `world_size() // local_world_size()`."""
        return max(1, self.world_size() // max(1, self.local_world_size()))

    def coordinator_address(self) -> str | None:
        """`main_address:main_port`, what `jax.distributed.initialize` connects to (None: JAX finds it)."""
        if self.main_address is None or self.main_port is None:
            return None
        host = self.main_address
        return f"[{host}]:{self.main_port}" if ":" in host else f"{host}:{self.main_port}"

    def local_device_ids(self) -> list[int] | None:
        """With several processes per machine, each drives the accelerator of its local rank
        (Lightning's one device per process); with one, all it sees (None). CPUs ignore it."""
        return [self.local_rank()] if self.local_world_size() > 1 else None

    def describe_variables(self) -> str:
        """The variables read that are set, `NAME='value'`, for messages."""
        seen = [f"{name}={os.environ[name]!r}" for name in self.variables if name in os.environ]
        return ", ".join(seen) if seen else f"none of {', '.join(self.variables)} set"

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(world_size={self.world_size()}, global_rank={self.global_rank()}, "
                f"local_rank={self.local_rank()}, node_rank={self.node_rank()})")
