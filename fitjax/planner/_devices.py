"""What each kind of device can do, for the planner's roofline: peak FLOP/s, memory, bandwidths.

One row per device kind, each figure from the vendor's own specification page (`source`). The
interconnect figure is the chip's total inter-chip bandwidth as the vendor states it (TPU ICI
over all its ports, NVLink over all its links): an upper bound on what one collective gets, so the
communication time the planner estimates is a lower bound.

`efficiency` is measured, not specified: the share of the peak a transformer train step reached on
that kind (model FLOPs over step time, `efficiency_source` names the run). The planner divides its
compute time by it, so a kind with a measurement gets an estimate of the step and one without
gets the roofline's lower bound. `memory_bytes` is what JAX reports the device can allocate where
that was read on the device (`memory_stats()["bytes_limit"]`), else the vendor's figure.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["DeviceSpec", "KINDS", "spec_for"]

_GIB = 1 << 30


class DeviceSpec(NamedTuple):
    """One device kind (one chip: a TPU chip, one GPU)."""

    name: str
    #: dense bf16 peak, FLOP/s
    peak_flops: float
    #: memory per device, bytes
    memory_bytes: int
    #: memory bandwidth, bytes/s
    memory_bandwidth: float
    #: inter-chip bandwidth per device, bytes/s (ICI, NVLink)
    interconnect_bandwidth: float
    source: str
    #: measured share of `peak_flops` a transformer step reaches (None: never measured)
    efficiency: float | None = None
    efficiency_source: str = ""


KINDS: dict[str, DeviceSpec] = {spec.name: spec for spec in (
    DeviceSpec("tpu-v4", 275e12, 32 * _GIB, 1200e9, 2400e9 / 8, "https://cloud.google.com/tpu/docs/v4"),
    DeviceSpec("tpu-v5e", 197e12, 16909336064, 819e9, 1600e9 / 8,
               "https://cloud.google.com/tpu/docs/v5e (memory: bytes_limit read on a v5e chip, JAX 0.10.2)",
               0.55, "benchmarks/results/tpu-v5e/sweep-profile-first.json: GPT-2 small, splash attention, 55% MFU"),
    DeviceSpec("tpu-v5p", 459e12, 95 * _GIB, 2765e9, 4800e9 / 8, "https://cloud.google.com/tpu/docs/v5p"),
    DeviceSpec("tpu-v6e", 918e12, 32 * _GIB, 1640e9, 3584e9 / 8, "https://cloud.google.com/tpu/docs/v6e"),
    DeviceSpec("gpu-a100", 312e12, 80 * _GIB, 2039e9, 600e9,
               "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
               "nvidia-a100-datasheet-nvidia-us-2188504-web.pdf (SXM4 80GB)"),
    DeviceSpec("gpu-h100", 989e12, 80 * _GIB, 3350e9, 900e9,
               "https://www.nvidia.com/en-us/data-center/h100/ (SXM, dense: half the sparse figure)"),
    DeviceSpec("gpu-h200", 989e12, 141 * 10**9, 4800e9, 900e9,
               "https://www.nvidia.com/en-us/data-center/h200/ (SXM, dense: half the sparse figure)",
               0.44, "docs/guides/plan.md, the plan against fits on one H200: the fit 2.27x the roofline"),
    DeviceSpec("gpu-l4", 121e12, 24 * _GIB, 300e9, 64e9,
               "https://www.nvidia.com/en-us/data-center/l4/ (dense; PCIe Gen4 x16, no NVLink)"),
)}

# JAX's `device_kind` strings -> the table's names (checked in order: "TPU v5 lite" before "TPU v5")
_DEVICE_KINDS = (("TPU v4", "tpu-v4"), ("TPU v5 lite", "tpu-v5e"), ("TPU v5e", "tpu-v5e"), ("TPU v5p", "tpu-v5p"),
                 ("TPU v5", "tpu-v5p"), ("TPU v6 lite", "tpu-v6e"), ("TPU v6e", "tpu-v6e"), ("A100", "gpu-a100"),
                 ("H100", "gpu-h100"), ("H200", "gpu-h200"), ("L4", "gpu-l4"))


def spec_for(device_kind: str) -> DeviceSpec | None:
    """The table's row for a JAX `device.device_kind` ("TPU v5 lite", "NVIDIA H100 80GB HBM3"),
    or None for a kind it has no figures for (a CPU)."""
    for marker, name in _DEVICE_KINDS:
        if marker in device_kind:
            return KINDS[name]
    return None
