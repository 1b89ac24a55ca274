"""`RayEnvironment`: a Ray Train worker group run by `fitjax.integrations.ray`."""

from __future__ import annotations

import os

from fitjax.plugins.environments._base import ClusterEnvironment, env_int

__all__ = ["RayEnvironment"]

#: what `fitjax.integrations.ray` sets in each worker from `ray.train.get_context()` and rank 0
VARIABLES = ("FITJAX_RAY_COORDINATOR", "FITJAX_RAY_WORLD_SIZE", "FITJAX_RAY_WORLD_RANK", "FITJAX_RAY_LOCAL_RANK",
             "FITJAX_RAY_LOCAL_WORLD_SIZE", "FITJAX_RAY_NODE_RANK")


class RayEnvironment(ClusterEnvironment):
    """A worker of a Ray Train worker group (`fitjax.integrations.ray.RayTrainer`).

    The integration copies Ray's ranks (`ray.train.get_context()`) into `FITJAX_RAY_*`
    variables and the coordinator rank 0 chose (its address, a free port) into
    `FITJAX_RAY_COORDINATOR`, so the environment only reads variables, like the others. They are
    set explicitly and come before any cluster's (a Ray cluster started inside a SLURM job still
    runs Ray's workers).
    """

    variables = VARIABLES

    @staticmethod
    def detect() -> bool:
        return "FITJAX_RAY_COORDINATOR" in os.environ

    @property
    def main_address(self) -> str:
        return os.environ["FITJAX_RAY_COORDINATOR"].rpartition(":")[0].strip("[]")

    @property
    def main_port(self) -> int:
        return int(os.environ["FITJAX_RAY_COORDINATOR"].rpartition(":")[2])

    def world_size(self) -> int:
        return env_int("FITJAX_RAY_WORLD_SIZE") or 1

    def global_rank(self) -> int:
        return env_int("FITJAX_RAY_WORLD_RANK") or 0

    def local_rank(self) -> int:
        return env_int("FITJAX_RAY_LOCAL_RANK") or 0

    def local_world_size(self) -> int:
        return env_int("FITJAX_RAY_LOCAL_WORLD_SIZE") or 1

    def node_rank(self) -> int:
        return env_int("FITJAX_RAY_NODE_RANK") or 0
