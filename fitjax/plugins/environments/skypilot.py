"""`SkyPilotEnvironment`: a SkyPilot task on several nodes, one process per node."""

from __future__ import annotations

import os

from fitjax.plugins.environments._base import ClusterEnvironment, env_int

__all__ = ["SkyPilotEnvironment"]

DEFAULT_PORT = 8476


class SkyPilotEnvironment(ClusterEnvironment):
    """`sky launch` with `num_nodes: N` running `python train.py` on every node.

    SkyPilot sets `SKYPILOT_NUM_NODES`, `SKYPILOT_NODE_RANK` and `SKYPILOT_NODE_IPS` (one IP a
    line, the head first); the coordinator is the head on `MASTER_PORT` or 8476.
    """

    variables = ("SKYPILOT_NUM_NODES", "SKYPILOT_NODE_RANK", "SKYPILOT_NODE_IPS", "MASTER_PORT")

    @staticmethod
    def detect() -> bool:
        return {"SKYPILOT_NUM_NODES", "SKYPILOT_NODE_RANK", "SKYPILOT_NODE_IPS"} <= os.environ.keys()

    @property
    def main_address(self) -> str:
        ips = os.environ.get("SKYPILOT_NODE_IPS", "").split()
        return ips[0] if ips else "127.0.0.1"

    @property
    def main_port(self) -> int:
        return env_int("MASTER_PORT") or DEFAULT_PORT

    def world_size(self) -> int:
        return env_int("SKYPILOT_NUM_NODES") or 1

    def global_rank(self) -> int:
        return env_int("SKYPILOT_NODE_RANK") or 0

    def local_rank(self) -> int:
        return 0

    def node_rank(self) -> int:
        return self.global_rank()
