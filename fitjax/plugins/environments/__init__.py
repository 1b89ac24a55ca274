"""Cluster environments (Lightning's `lightning.pytorch.plugins.environments`).

Each says where this process stands: world size, global/local/node rank, coordinator, local
devices. `detect()` picks the first whose launcher started this process, in Lightning's order
(SLURM, torchelastic, Kubeflow, MPI), then SkyPilot and Cloud TPU, else `LightningEnvironment`;
`JAX_NUM_PROCESSES`/`JAX_PROCESS_ID` set explicitly (as `fitjax launch` does) come first.
`Trainer(plugins=[env])` names one instead.
"""

from __future__ import annotations

from typing import Any, Iterable

from fitjax.plugins.environments._base import ClusterEnvironment
from fitjax.plugins.environments.lightning import LightningEnvironment
from fitjax.plugins.environments.mpi import MPIEnvironment
from fitjax.plugins.environments.skypilot import SkyPilotEnvironment
from fitjax.plugins.environments.slurm import SLURMEnvironment
from fitjax.plugins.environments.torchelastic import KubeflowEnvironment, TorchElasticEnvironment
from fitjax.plugins.environments.xla import XLAEnvironment

__all__ = [
    "ClusterEnvironment",
    "DETECTION_ORDER",
    "KubeflowEnvironment",
    "LightningEnvironment",
    "MPIEnvironment",
    "SLURMEnvironment",
    "SkyPilotEnvironment",
    "TorchElasticEnvironment",
    "XLAEnvironment",
    "detect",
    "from_plugins",
]

#: checked in this order; LightningEnvironment is the fallback
DETECTION_ORDER: tuple[type[ClusterEnvironment], ...] = (
    SLURMEnvironment, TorchElasticEnvironment, KubeflowEnvironment, MPIEnvironment, SkyPilotEnvironment,
    XLAEnvironment,
)


def detect() -> ClusterEnvironment:
    """The environment that started this process (default arguments)."""
    if LightningEnvironment.explicitly_set():
        return LightningEnvironment()
    for kind in DETECTION_ORDER:
        if kind.detect():
            return kind()
    return LightningEnvironment()


def from_plugins(plugins: Any) -> ClusterEnvironment:
    """`Trainer(plugins=...)`'s cluster environment, else the detected one.

    Raises:
        ValueError: a plugin fitjax does not know, or two cluster environments.
    """
    if plugins is None:
        return detect()
    items: Iterable[Any] = plugins if isinstance(plugins, (list, tuple)) else [plugins]
    found = []
    for plugin in items:
        if isinstance(plugin, ClusterEnvironment):
            found.append(plugin)
        else:
            raise ValueError(
                f"Trainer(plugins=...) got {plugin!r}; fitjax takes cluster environments there "
                f"(fj.plugins.environments: {', '.join(n for n in __all__ if n.endswith('Environment'))}). "
                "Precision is `Trainer(precision=...)`, checkpointing is Orbax's (built in)."
            )
    if len(found) > 1:
        raise ValueError(f"Trainer(plugins=...) got {len(found)} cluster environments {found!r}; pass one.")
    return found[0] if found else detect()
