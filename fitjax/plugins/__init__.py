"""Plugins, Lightning's `Trainer(plugins=[...])`: for now the cluster environments.

`fj.plugins.environments` says where the processes of a run come from (SLURM, torchrun,
Kubeflow, MPI, Cloud TPU, `fitjax launch`).
"""

from fitjax.plugins import environments
from fitjax.plugins.environments import ClusterEnvironment

__all__ = ["ClusterEnvironment", "environments"]
