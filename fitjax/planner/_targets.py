"""Where a plan is for: this machine's devices, a TPU slice compiled deviceless, or a GPU kind.

A TPU slice needs no TPU: libtpu describes its topology (`jax.experimental.topologies`) and XLA
compiles for it on this machine, so the plan's memory and FLOPs are the TPU compiler's own.
libtpu writes warnings about the missing hardware straight to the process's stderr; they are kept
out of fitjax's output (`quiet_stderr`) and shown only when something fails.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import sys
import tempfile
from typing import Iterator, NamedTuple, Sequence

import jax

from fitjax.planner._devices import KINDS, DeviceSpec, spec_for
from fitjax.step import xla_tpu

__all__ = ["TPU_NAMES", "Target", "device_memory_limit", "quiet_stderr", "resolve_target"]


class Target(NamedTuple):
    """The devices a plan compiles for and what the table knows of their kind."""

    name: str
    devices: tuple
    #: the device kind's figures (None: a kind with no row, such as a CPU)
    spec: DeviceSpec | None
    #: memory per device the plan must fit in, bytes (None: unknown, nothing to fit under)
    memory_bytes: int | None

    @property
    def platform(self) -> str:
        return self.devices[0].platform

    @property
    def deviceless(self) -> bool:
        """Compiled for a topology, not for devices of this process."""
        return self.devices[0] not in jax.devices()


# chips of a slice -> libtpu's topology: 2-D tori for v5e/v6e, 3-D for v4/v5p
_SHAPES_2D = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"}
_SHAPES_3D = {4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4", 128: "4x4x8", 256: "4x8x8",
              512: "8x8x8", 1024: "8x8x16", 2048: "8x16x16", 4096: "16x16x16"}
# version -> (libtpu's name, table row, shapes, TensorCores the slice name counts per chip)
_TPUS = {"v4": ("v4", "tpu-v4", _SHAPES_3D, 2), "v5p": ("v5p", "tpu-v5p", _SHAPES_3D, 2),
         "v5e": ("v5e", "tpu-v5e", _SHAPES_2D, 1), "v5litepod": ("v5e", "tpu-v5e", _SHAPES_2D, 1),
         "v6e": ("v6e", "tpu-v6e", _SHAPES_2D, 1)}
_TPU_NAME = re.compile(r"^(?:tpu-)?(v4|v5p|v5e|v5litepod|v6e)-(\d+)$")
TPU_NAMES = ("tpu-v4-8", "tpu-v5e-16", "tpu-v5p-128", "tpu-v6e-8", "tpu-v6e-256")  # examples for errors


def resolve_target(target: str | None, local_devices: Sequence[jax.Device], *,
                   memory_bytes: int | None = None) -> Target:
    """`target` ("local" or None: `local_devices`; a TPU slice such as "tpu-v5e-16" (v5e and
    v6e count chips, v4 and v5p TensorCores, as Cloud TPU names them); a GPU kind such as
    "gpu-h100", only on a machine with that GPU) as a `Target`. `memory_bytes` overrides the
    memory per device."""
    if target is None or target == "local":
        devices = tuple(local_devices)
        spec = spec_for(devices[0].device_kind)
        return Target("local", devices, spec, memory_bytes or device_memory_limit(devices[0]) or
                      (spec.memory_bytes if spec else None))
    if not isinstance(target, str):
        raise TypeError(f"plan(target=...) must be a str such as 'local' or 'tpu-v5e-16', got {target!r}.")
    name = target.lower()
    match = _TPU_NAME.match(name)
    if match:
        return _tpu(target, match.group(1), int(match.group(2)), memory_bytes)
    if name in KINDS and name.startswith("gpu-"):
        here = spec_for(local_devices[0].device_kind)
        if here is None or here.name != name:
            raise ValueError(
                f"plan(target={target!r}): a GPU can only be planned for on a machine that has one (XLA "
                f"compiles for the GPU it finds); this machine's devices are {local_devices[0].device_kind!r}. "
                f"Run `fitjax plan` there, or plan for a TPU slice from here ({', '.join(TPU_NAMES)}).")
        return resolve_target("local", local_devices, memory_bytes=memory_bytes)._replace(name=name)
    raise ValueError(
        f"plan(target=...) got {target!r}; use 'local' (this machine's devices), a TPU slice "
        f"({', '.join(TPU_NAMES)}, ...: tpu-<v4|v5e|v5p|v6e>-<size>) or, on a machine with that GPU, "
        f"{', '.join(k for k in KINDS if k.startswith('gpu-'))}.")


def _tpu(target: str, version: str, size: int, memory_bytes: int | None) -> Target:
    libtpu_name, row, shapes, per_chip = _TPUS[version]
    chips, left = divmod(size, per_chip)
    if left or chips not in shapes:
        sizes = ", ".join(str(c * per_chip) for c in shapes)
        raise ValueError(f"plan(target={target!r}): a {version} slice has one of these sizes: {sizes}.")
    if importlib.util.find_spec("libtpu") is None:
        raise ImportError(
            f"plan(target={target!r}) compiles for a TPU slice with libtpu, which is not installed: "
            "pip install 'fitjax[tpu-plan]' (no TPU is needed, only the library).")
    with quiet_stderr() as said:
        try:
            topology = xla_tpu.deviceless_topology(f"{libtpu_name}:{shapes[chips]}")
        except Exception as exc:  # noqa: BLE001 - libtpu raises its own runtime errors
            raise RuntimeError(f"plan(target={target!r}): libtpu could not describe the {version} topology "
                               f"{shapes[chips]}: {exc}\n{said()}") from exc
    spec = KINDS[row]
    return Target(f"tpu-{version}-{size}", tuple(topology.devices), spec, memory_bytes or spec.memory_bytes)


def device_memory_limit(device: jax.Device) -> int | None:
    """The device's memory limit in bytes (None where it reports none, as XLA:CPU)."""
    try:
        stats = device.memory_stats()
    except Exception:  # noqa: BLE001 - backends without memory statistics raise various errors
        return None
    return int(stats["bytes_limit"]) if stats and stats.get("bytes_limit") else None


@contextlib.contextmanager
def quiet_stderr() -> Iterator:
    """Everything written to the process's stderr (file descriptor 2, where libtpu's C++ logging
    goes) is kept aside while inside; yields a function returning what was written."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as kept:
        os.dup2(kept.fileno(), 2)
        try:
            yield lambda: _read(kept)
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


def _read(kept) -> str:
    kept.flush()
    kept.seek(0)
    return kept.read().decode(errors="replace")
