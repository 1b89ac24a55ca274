"""`fj.plan(module, data, target=..., **trainer_kwargs)`: `Trainer(**trainer_kwargs).plan(...)`."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from fitjax.data import DataModule
from fitjax.loop.trainer import Trainer
from fitjax.module import LitModule
from fitjax.planner import Plan, planned_strategy

__all__ = ["plan", "plans_elsewhere"]

# a plan writes nothing: no logs, no checkpoints, no bars (the user may still pass their own)
_QUIET = {"logger": False, "enable_checkpointing": False, "enable_progress_bar": False,
          "enable_model_summary": False}


def plans_elsewhere(target: Any, strategy: Any) -> bool:
    """Whether a plan for `target` takes `strategy` apart from the trainer (`Trainer.plan(strategy=...)`),
    its mesh built over the target's devices alone: a target other than "local", and a strategy
    that is not the planner's own choice ("plan")."""
    return target not in (None, "local") and planned_strategy(strategy) is None


def plan(module: LitModule, train_data: Any = None, *, datamodule: DataModule | None = None, target: str = "local",
         sweep: bool | Mapping[str, Sequence] = False, memory_bytes: int | None = None, headroom: float = 0.1,
         **trainer_kwargs: Any) -> Plan:
    """Plans the train step a `Trainer(**trainer_kwargs)` would run for `module` on `target`:
    see `Trainer.plan` for the arguments and what is reported.

    For a target other than "local", `strategy` is resolved for the target's devices, not this
    machine's: "auto" is "dp" over a slice's chips, and `FSDP(fsdp=4, tensor=2)` plans for
    "tpu-v5e-8" from a laptop with one device.

    Example:
        >>> import fitjax as fj
        >>> # print(fj.plan(GPTModule(), data, target="tpu-v5e-16", strategy="fsdp", precision="bf16-mixed"))
    """
    strategy = trainer_kwargs.get("strategy", "auto")
    elsewhere = plans_elsewhere(target, strategy)
    if elsewhere:  # the trainer runs nothing here: its own strategy is this machine's default
        trainer_kwargs.pop("strategy", None)
    trainer = Trainer(**{**_QUIET, **trainer_kwargs})
    return trainer.plan(module, train_data, datamodule=datamodule, target=target, sweep=sweep,
                        memory_bytes=memory_bytes, headroom=headroom, strategy=strategy if elsewhere else None)
