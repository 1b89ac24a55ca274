"""`TorchElasticEnvironment` (torchrun) and `KubeflowEnvironment` (Kubeflow's PyTorchJob)."""

from __future__ import annotations

import os

from fitjax.plugins.environments._base import ClusterEnvironment, env_int

__all__ = ["KubeflowEnvironment", "TorchElasticEnvironment"]


class TorchElasticEnvironment(ClusterEnvironment):
    """Processes started by `torchrun` (Lightning's `TorchElasticEnvironment`).

    `RANK` is the global rank, `LOCAL_RANK` the rank on this machine, `GROUP_RANK` the machine's
    index, `WORLD_SIZE` and `LOCAL_WORLD_SIZE` the counts. The coordinator runs on `MASTER_ADDR`
    at `MASTER_PORT + 1`: torchrun's agent already listens on `MASTER_PORT` (its rendezvous store,
    `TORCHELASTIC_USE_AGENT_STORE=True`).

    Example:
        >>> # shell: torchrun --nnodes 2 --nproc_per_node 8 --rdzv-endpoint host0:29500 train.py
        >>> # train.py: trainer = fj.Trainer(num_nodes=2, devices=8)   8 processes of 1 GPU per machine
    """

    variables = ("RANK", "GROUP_RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE", "GROUP_WORLD_SIZE",
                 "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE")

    @staticmethod
    def detect() -> bool:
        return {"RANK", "GROUP_RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE"} <= os.environ.keys()  # Lightning's test

    @property
    def main_address(self) -> str:
        return os.environ.get("MASTER_ADDR") or "127.0.0.1"

    @property
    def main_port(self) -> int | None:
        port = env_int("MASTER_PORT")
        if port is None:
            return None
        return port + 1 if os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true" else port

    def world_size(self) -> int:
        return env_int("WORLD_SIZE") or 1

    def global_rank(self) -> int:
        return env_int("RANK") or 0

    def local_rank(self) -> int:
        return env_int("LOCAL_RANK") or 0

    def node_rank(self) -> int:
        return env_int("GROUP_RANK") or 0

    def local_world_size(self) -> int:
        return env_int("LOCAL_WORLD_SIZE") or 1

    def num_nodes(self) -> int:
        return env_int("GROUP_WORLD_SIZE") or super().num_nodes()


class KubeflowEnvironment(ClusterEnvironment):
    """A Kubeflow PyTorchJob: one process per pod (Lightning's `KubeflowEnvironment`).

    The training operator sets `MASTER_ADDR`/`MASTER_PORT` (the master pod's service),
    `WORLD_SIZE` (pods) and `RANK` (this pod); each pod is one machine.
    """

    variables = ("KUBERNETES_PORT", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")

    @staticmethod
    def detect() -> bool:
        return {"KUBERNETES_PORT", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK"} <= os.environ.keys()

    @property
    def main_address(self) -> str:
        return os.environ["MASTER_ADDR"]

    @property
    def main_port(self) -> int | None:
        return env_int("MASTER_PORT")

    def world_size(self) -> int:
        return env_int("WORLD_SIZE") or 1

    def global_rank(self) -> int:
        return env_int("RANK") or 0

    def local_rank(self) -> int:
        return 0

    def node_rank(self) -> int:
        return self.global_rank()
