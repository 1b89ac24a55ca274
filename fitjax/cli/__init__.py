"""Train from the command line and config files (`LightningCLI`), and start local multi-process runs.

`LightningCLI` and its parts need jsonargparse (`pip install "fitjax[cli]"`) and import it when
first used; `import fitjax` and `fitjax launch` do not import it.
"""

from __future__ import annotations

import importlib
from typing import Any

from fitjax.cli._launch import launch
from fitjax.cli._main import main

__all__ = [
    "LightningArgumentParser",
    "LightningCLI",
    "OptaxOptimizer",
    "OptaxSchedule",
    "SaveConfigCallback",
    "launch",
    "main",
]

# name -> module; imported on first access (each imports jsonargparse)
_LAZY = {
    "LightningArgumentParser": "fitjax.cli._cli",
    "LightningCLI": "fitjax.cli._cli",
    "SaveConfigCallback": "fitjax.cli._cli",
    "OptaxOptimizer": "fitjax.cli._optax",
    "OptaxSchedule": "fitjax.cli.schedules",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'fitjax.cli' has no attribute {name!r}")
    try:
        module = importlib.import_module(_LAZY[name])
    except ModuleNotFoundError as exc:
        if exc.name != "jsonargparse":
            raise
        raise ModuleNotFoundError(
            f"fitjax.cli.{name} needs jsonargparse, which is not installed: "
            "pip install 'fitjax[cli]' (or 'jsonargparse[signatures]')."
        ) from exc
    value = getattr(module, name)
    globals()[name] = value
    return value
