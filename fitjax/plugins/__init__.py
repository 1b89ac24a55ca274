"""Plugins, Lightning's `Trainer(plugins=[...])`: the cluster environments.

`fj.plugins.environments` (also importable from here) says where the processes of a run come
from: SLURM, torchrun, Kubeflow, MPI, SkyPilot, Cloud TPU, `fitjax launch`.
"""

from fitjax.plugins import environments
from fitjax.plugins.environments import (
    ClusterEnvironment,
    KubeflowEnvironment,
    LightningEnvironment,
    MPIEnvironment,
    SkyPilotEnvironment,
    SLURMEnvironment,
    TorchElasticEnvironment,
    XLAEnvironment,
)

__all__ = [
    "ClusterEnvironment",
    "KubeflowEnvironment",
    "LightningEnvironment",
    "MPIEnvironment",
    "SLURMEnvironment",
    "SkyPilotEnvironment",
    "TorchElasticEnvironment",
    "XLAEnvironment",
]
