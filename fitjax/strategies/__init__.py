"""Strategies: how the train state and batches are laid out over devices.

`resolve(name_or_instance)` maps Trainer's `strategy=` argument to an instance through one
registry; an unknown name gets an error listing the valid ones.
"""

from __future__ import annotations

from typing import Callable

from fitjax.strategies._base import Strategy
from fitjax.strategies._describe import LeafSharding, bytes_per_device, describe_sharding, peak_bytes
from fitjax.strategies._distributed import initialize_distributed
from fitjax.strategies.dp import DataParallel
from fitjax.strategies.fsdp import FSDP, with_model_rules
from fitjax.strategies.runs_parallel import RunsParallel
from fitjax.strategies.single import SingleDevice

# For the Trainer, not part of the user-facing API: `accelerator=` resolved to JAX devices and the
# banner that says what a run uses, and `deterministic=True`'s settings. Which devices, and how XLA
# compiles for them, are the platform side that the strategies lay the state out over.
from fitjax.strategies._accelerator import accelerator_devices, check_devices_match
from fitjax.strategies._accelerator import banner as accelerator_banner
from fitjax.strategies._determinism import enforce as enforce_determinism
# For the step and the Trainer: state kept in host memory between programs (`Trainer(offload=...)`).
from fitjax.strategies._memory import (HOST, any_on_host, check_host_memory, fetched, in_device_memory, on_host,
                                      stored_like)
# For the loop, callbacks, loggers and the CLI: what every process agrees on (a flag, process 0's
# string, rows gathered from all) and the stop vote read between steps.
from fitjax.strategies._distributed import agree, broadcast_str, gather_rows
from fitjax.strategies._stop_agreement import StopAgreement

__all__ = [
    "DataParallel",
    "FSDP",
    "LeafSharding",
    "RunsParallel",
    "SingleDevice",
    "Strategy",
    "bytes_per_device",
    "describe_sharding",
    "initialize_distributed",
    "peak_bytes",
    "register",
    "resolve",
    "with_model_rules",
]

_REGISTRY: dict[str, Callable[[], Strategy]] = {
    "single": SingleDevice,
    "dp": DataParallel,
    "ddp": DataParallel,  # Lightning's name for the same thing
    "fsdp": FSDP,
    "zero1": lambda: DataParallel(zero1=True),  # optimizer state sharded, parameters replicated
    "runs": RunsParallel,  # the runs of Trainer(runs=...) split over the devices, the batch whole
}


def register(name: str, factory: Callable[[], Strategy]) -> None:
    """Makes `Trainer(strategy=name)` build `factory()`."""
    _REGISTRY[name] = factory


def resolve(strategy: str | Strategy, *, num_devices: int) -> Strategy:
    """`"auto"` is `"dp"` over several devices and `"single"` over one."""
    if isinstance(strategy, Strategy):
        return strategy
    if strategy == "auto":
        strategy = "dp" if num_devices > 1 else "single"
    if isinstance(strategy, str) and strategy in _REGISTRY:
        return _REGISTRY[strategy]()
    raise ValueError(
        f"Trainer(strategy=...) got {strategy!r}; use one of {['auto', 'plan', *sorted(_REGISTRY)]} or a "
        "fitjax.strategies.Strategy instance."
    )
