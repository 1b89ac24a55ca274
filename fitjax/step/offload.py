"""Optimizer state and master weights in host memory (`Trainer(offload=...)`).

- "none": the whole train state in device memory (the default).
- "optimizer": the optimizer state (Adam's two moments: 8 bytes a float32 parameter, half that
  with `fj.optim.adamw(moments="bfloat16")`) lives in the devices' pinned host memory between
  steps. Each step copies it to device memory for the update and XLA copies the new state back
  at the step's end (`fitjax.strategies._memory`): the device holds it only while the step runs,
  and none of it between steps, checkpoints or evaluation.
- "optimizer+master": the parameters in their storage dtype too (the float32 master weights of
  "bf16-mixed"; the parameters themselves under "32-true"). Each step copies them in, casts
  them to the compute dtype and copies the updated ones back; evaluation copies them in.

The numbers are the same as without offload (the same program around two copies): what changes
is where the bytes sit between programs, paid in host<->device transfers each step (on a TPU
v5e ~2x the offloaded bytes over PCIe per step). It pays when the state does not fit beside the
activations otherwise; `fitjax plan` counts the offloaded bytes as host memory, not the device's.
XLA:CPU has the same memory kinds (the bytes stay in the same RAM), so the option runs, and is
tested, on CPU.

Every strategy combines with it: the placement is the strategy's sharding of each leaf with the
host memory kind.
"""

from __future__ import annotations

from typing import Any

from fitjax.state import TrainState
from fitjax.strategies import on_host

__all__ = ["OFFLOADS", "check_offload", "offloaded_fields", "place"]

#: `Trainer(offload=...)` -> the fields of the `TrainState` kept in host memory
OFFLOADS: dict[str, tuple[str, ...]] = {
    "none": (),
    "optimizer": ("opt_state",),
    "optimizer+master": ("opt_state", "params"),
}


def check_offload(value: Any) -> str:
    if isinstance(value, str) and value in OFFLOADS:
        return value
    raise ValueError(f"Trainer(offload=...) got {value!r}; use one of {list(OFFLOADS)} ('optimizer': the "
                     "optimizer state in host memory between steps; 'optimizer+master': the parameters in "
                     "their storage dtype too).")


def offloaded_fields(offload: str) -> tuple[str, ...]:
    """The `TrainState` fields `offload` keeps in host memory."""
    return OFFLOADS[offload]


def place(shardings: TrainState, offload: str) -> TrainState:
    """The state's shardings with the fields `offload` names in host memory."""
    fields = offloaded_fields(offload)
    if not fields:
        return shardings
    return shardings.replace(**{name: on_host(getattr(shardings, name)) for name in fields})
