"""`MPIEnvironment`: processes started by `mpirun` (Open MPI, MPICH, Intel MPI), without mpi4py."""

from __future__ import annotations

import os
import re

from fitjax.plugins.environments._base import ClusterEnvironment, env_int

__all__ = ["MPIEnvironment"]


class MPIEnvironment(ClusterEnvironment):
    """An MPI job: ranks from Open MPI's `OMPI_COMM_WORLD_*` or MPICH's / Intel MPI's `PMI_*`.

    Lightning's `MPIEnvironment` asks mpi4py; the launcher's variables say the same without it.
    The coordinator is `MASTER_ADDR:MASTER_PORT` when set (`mpirun -x MASTER_ADDR=... -x
    MASTER_PORT=...`), else under Open MPI the launching host's address from
    `OMPI_MCA_orte_hnp_uri` on a port derived from the job id (JAX's own rule), so every rank
    computes the same one.

    Example:
        >>> # shell: mpirun -np 16 --npernode 8 -x MASTER_ADDR=host0 -x MASTER_PORT=1234 python train.py
    """

    variables = ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
                 "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_MCA_orte_hnp_uri", "PMI_SIZE", "PMI_RANK",
                 "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "MASTER_ADDR", "MASTER_PORT")

    @staticmethod
    def detect() -> bool:
        return "OMPI_COMM_WORLD_SIZE" in os.environ or "PMI_SIZE" in os.environ

    def _hnp(self) -> tuple[str, int] | None:
        uri = os.environ.get("OMPI_MCA_orte_hnp_uri")  # "28311552.0;tcp://192.0.2.2:43355;tcp6://[fd00::2]:39949"
        match = re.search(r"tcp://([^,:;]+)|tcp6://\[([^,\]]+)", uri or "")
        if uri is None or match is None or not uri.split(".", 1)[0].isdigit():
            return None
        job = int(uri.split(".", 1)[0]) // 2**12  # Open MPI's job ids are multiples of 2**12
        return next(g for g in match.groups() if g), job % 2**12 + (65535 - 2**12 + 1)

    @property
    def main_address(self) -> str | None:
        if os.environ.get("MASTER_ADDR"):
            return os.environ["MASTER_ADDR"]
        hnp = self._hnp()
        return None if hnp is None else hnp[0]

    @property
    def main_port(self) -> int | None:
        port = env_int("MASTER_PORT")
        if port is not None:
            return port
        hnp = self._hnp()
        return None if hnp is None else hnp[1]

    def world_size(self) -> int:
        return env_int("OMPI_COMM_WORLD_SIZE", "PMI_SIZE") or 1

    def global_rank(self) -> int:
        return env_int("OMPI_COMM_WORLD_RANK", "PMI_RANK") or 0

    def local_rank(self) -> int:
        return env_int("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID") or 0

    def local_world_size(self) -> int:
        return env_int("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS") or 1

    def node_rank(self) -> int:
        # ranks fill machines in order (mpirun's default --map-by slot/core); Open MPI's
        # OMPI_COMM_WORLD_NODE_RANK is the rank among this machine's processes, not the machine
        return self.global_rank() // self.local_world_size()
