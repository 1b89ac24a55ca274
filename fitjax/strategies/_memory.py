"""Arrays kept in host memory between programs, and moved to the device by the program that uses them.

A `NamedSharding` carries a memory kind: "device" (the accelerator's memory, the default) or
"pinned_host" (page-locked host memory the device reads over DMA; TPU, GPU and XLA:CPU have it).
A leaf whose sharding says "pinned_host" lives there between programs; JAX refuses arithmetic
that mixes memory kinds, so a program that computes with it first copies it to device memory
(`jax.device_put(x, jax.memory.Space.Device)` inside the jitted function: an asynchronous
transfer XLA schedules like any other op), and an output whose sharding says "pinned_host" is
copied back (`stored_like`, or by XLA at the program's end).

`Strategy.jit` copies every argument whose in_sharding is a host one to the device at the
program's start (`device_inputs`), so an evaluation or a piece of the loop written for device
arrays runs unchanged on a state kept in host memory. The train step opts out: it fetches the
optimizer state only once the gradients exist (`fitjax.step.train`), so the device never holds
it beside the activations.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import jax
from jax.sharding import Sharding

__all__ = ["HOST", "any_on_host", "check_host_memory", "device_inputs", "fetched", "has_host", "in_device_memory", "on_host",
           "on_host_space", "stored_like"]

#: the memory kind of host memory the device reads directly (page-locked)
HOST = "pinned_host"
_DEVICE = "device"


def on_host(shardings: Any) -> Any:
    """Each sharding of the tree `shardings` with the host memory kind."""
    return jax.tree.map(lambda s: s.with_memory_kind(HOST), shardings, is_leaf=lambda x: isinstance(x, Sharding))


def has_host(shardings: Any) -> bool:
    """Whether any sharding of the tree (a prefix of the arguments' tree) is a host one."""
    return any(getattr(s, "memory_kind", None) == HOST
               for s in jax.tree.leaves(shardings, is_leaf=lambda x: isinstance(x, Sharding)))


def on_host_space(x: Any) -> bool:
    """Whether the array (or tracer) `x` lives in host memory."""
    return jax.typeof(x).memory_space == jax.memory.Space.Host


def fetched(tree: Any) -> Any:
    """Inside a jitted function: `tree` with each leaf kept in host memory copied to device memory
    (same layout); the others as they are."""
    return jax.tree.map(lambda x: jax.device_put(x, jax.memory.Space.Device) if on_host_space(x) else x, tree)


def stored_like(tree: Any, like: Any) -> Any:
    """Inside a jitted function: `tree` with each leaf whose counterpart in `like` (the same
    structure) lives in host memory copied there, so a value goes back where it came from (a
    scan's carry keeps its memory kinds)."""
    return jax.tree.map(lambda x, old: jax.device_put(x, jax.memory.Space.Host) if on_host_space(old) else x,
                        tree, like)


def any_on_host(tree: Any) -> bool:
    return any(on_host_space(x) for x in jax.tree.leaves(tree))


def in_device_memory(tree: Any) -> Any:
    """Outside any jitted function: `tree` with each array kept in host memory copied to device
    memory with the same layout (a new array); the others as they are."""
    def move(x):
        kind = getattr(getattr(x, "sharding", None), "memory_kind", None)
        return jax.device_put(x, x.sharding.with_memory_kind(_DEVICE)) if kind == HOST else x

    return jax.tree.map(move, tree)


def device_inputs(fn: Callable, in_shardings: Any) -> Callable:
    """`fn(*args)` with every argument laid out in host memory by `in_shardings` copied to device
    memory first (`fetched`); `fn` itself when none is. The name stays `fn`'s (compile logs)."""
    if not has_host(in_shardings):
        return fn

    @functools.wraps(fn)
    def on_device(*args):
        return fn(*fetched(args))

    return on_device


def check_host_memory(devices: Sequence[Any], argument: str) -> None:
    """Raises naming `argument` unless every device of `devices` can address host memory
    ("pinned_host"). Devices that do not list their memories (a compile-only topology) pass:
    TPU, GPU and XLA:CPU all have it."""
    for device in devices:
        listed = getattr(device, "addressable_memories", None)
        if listed is None:
            continue
        try:
            kinds = sorted(m.kind for m in listed())
        except Exception:  # noqa: BLE001 - a device of a topology has no client to ask: it cannot say
            continue
        if HOST not in kinds:
            raise ValueError(
                f"{argument} keeps arrays in host memory (memory kind {HOST!r}), which the "
                f"{device.platform} device {device} does not have (its memories: {kinds}). Use a TPU, a "
                "GPU or the CPU, or leave the option off.")
