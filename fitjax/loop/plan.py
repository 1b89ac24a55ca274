"""`fj.plan(module, data, target=..., **trainer_kwargs)`: `Trainer(**trainer_kwargs).plan(...)`."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from fitjax.data import DataModule
from fitjax.loop.trainer import Trainer
from fitjax.module import LitModule
from fitjax.planner import Plan

__all__ = ["plan"]

# a plan writes nothing: no logs, no checkpoints, no bars (the user may still pass their own)
_QUIET = {"logger": False, "enable_checkpointing": False, "enable_progress_bar": False,
          "enable_model_summary": False}


def plan(module: LitModule, train_data: Any = None, *, datamodule: DataModule | None = None, target: str = "local",
         sweep: bool | Mapping[str, Sequence] = False, memory_bytes: int | None = None, headroom: float = 0.1,
         **trainer_kwargs: Any) -> Plan:
    """Plans the train step a `Trainer(**trainer_kwargs)` would run for `module` on `target`:
    see `Trainer.plan` for the arguments and what is reported.

    Example:
        >>> import fitjax as fj
        >>> # print(fj.plan(GPTModule(), data, target="tpu-v5e-16", strategy="fsdp", precision="bf16-mixed"))
    """
    trainer = Trainer(**{**_QUIET, **trainer_kwargs})
    return trainer.plan(module, train_data, datamodule=datamodule, target=target, sweep=sweep,
                        memory_bytes=memory_bytes, headroom=headroom)
