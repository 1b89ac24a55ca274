"""Train from the command line and config files (`LightningCLI`), and start local multi-process runs.

Needs jsonargparse (`pip install "fitjax[cli]"`); `import fitjax` does not import it, only
`fitjax.cli` (or `fj.LightningCLI`) does.
"""

from fitjax.cli._cli import LightningArgumentParser, LightningCLI, SaveConfigCallback, main
from fitjax.cli._launch import launch
from fitjax.cli._optax import OptaxOptimizer
from fitjax.cli.schedules import OptaxSchedule

__all__ = [
    "LightningArgumentParser",
    "LightningCLI",
    "OptaxOptimizer",
    "OptaxSchedule",
    "SaveConfigCallback",
    "launch",
    "main",
]
