"""How fitjax treats XLA:TPU: libtpu is loaded only where a TPU may be.

**No TPU, no libtpu (process-wide, at `import fitjax`).** `pip install "fitjax[dev]"` (and
`[tpu-plan]`) installs libtpu so that `fitjax plan --target tpu-...` compiles for a TPU slice on
any machine. JAX then tries libtpu as a backend when it starts its backends, on every machine:
on one without a TPU libtpu prints its probe ("Failed to find host bounds for accelerator type",
an `E0000 ... INVALID_ARGUMENT` with a "Source Location Trace": 6-12 lines on stderr) before
the program's first line, and it registers its profiler, which then kills the process with a
segmentation fault when `Trainer(profiler="jax")` starts a trace (measured: exit 139 on a 2-core
CPU machine with libtpu 0.0.52, jax 0.10.2; the same fit profiles fine without libtpu).

So `skip_absent_tpu()`, called first thing by `fitjax/__init__.py`, takes the TPU out of the
backends JAX will try when nothing says a TPU is here: no TPU chip on the PCI bus (the check JAX
itself runs at import), no `/dev/accel*` or `/dev/vfio/*` device (how TPU VMs expose the chips),
no `TPU_*` variable set by the machine or the user (`TPU_ACCELERATOR_TYPE`,
`TPU_WORKER_HOSTNAMES`, ...; not those JAX and libtpu set on every machine, `_SET_EVERYWHERE`),
no `JAX_FORCE_TPU_INIT`, and no platform list chosen by the user (`JAX_PLATFORMS` or
`jax.config.update("jax_platforms", ...)`: their choice stands, probe included). JAX does the
same for CUDA (it skips the CUDA backend when no NVIDIA device file exists); GPUs and every other
backend are untouched, and a TPU VM keeps its TPU with no setting. Nothing changes once JAX's
backends have started (a program that used JAX before importing fitjax keeps what JAX found).

**A TPU topology without a TPU (`deviceless_topology`).** The planner's TPU targets need libtpu
on any machine: it describes a slice (`jax.experimental.topologies`, which loads libtpu outside
the backends) and XLA compiles for it. JAX registers libtpu's profiler as it loads it, and that
profiler crashes the process at the next `jax.profiler` trace, as above (a plan, then a profiled
fit in one process: exit 139; libtpu 0.0.52 says "Unexpected PLUGIN_Profiler_Api size: expected
80, got 104" first: it was built against another jaxlib than 0.10.2). `deviceless_topology`
loads libtpu without registering its profiler: a process with no TPU has nothing for it to
trace. Where libtpu is already loaded (a TPU backend), nothing is loaded or registered again.
"""

from __future__ import annotations

import contextlib
import glob
import os
from typing import Any, Iterator

__all__ = ["deviceless_topology", "skip_absent_tpu", "tpu_may_be_present"]

# Set by JAX (`cloud_tpu_init`, at `import jax`) or libtpu (at its import) on any machine, and
# inherited by child processes: they say nothing about the hardware.
_SET_EVERYWHERE = frozenset({"TPU_LIBRARY_PATH", "TPU_SKIP_MDS_QUERY", "TPU_ML_PLATFORM",
                             "TPU_ML_PLATFORM_VERSION"})
_DEVICE_FILES = ("/dev/accel*", "/dev/vfio/[0-9]*")  # TPU v2-v5p; v5e and newer through VFIO


def tpu_may_be_present() -> bool:
    """Whether anything on this machine or in the environment says a TPU may be here: a TPU chip
    on the PCI bus, a TPU device file, a `TPU_*` environment variable or `JAX_FORCE_TPU_INIT`.
    Reads a few files and the environment (no library is loaded)."""
    if "JAX_FORCE_TPU_INIT" in os.environ:
        return True
    if any(name.startswith("TPU_") and name not in _SET_EVERYWHERE for name in os.environ):
        return True
    if any(glob.glob(pattern) for pattern in _DEVICE_FILES):
        return True
    return _tpu_chips_on_pci() > 0


def _tpu_chips_on_pci() -> int:
    try:
        from jax._src import hardware_utils  # the PCI scan JAX runs at import (no public name)

        return hardware_utils.num_available_tpu_chips_and_device_id()[0]
    except (ImportError, AttributeError, OSError):
        return 1  # cannot tell: assume a TPU may be here (the probe is noise; a lost TPU is not)


def skip_absent_tpu() -> bool:
    """Takes the TPU out of the backends JAX tries when no TPU may be present (module docstring);
    True when it did so now. Does nothing when the user chose JAX's platforms or when JAX's
    backends have started."""
    import jax
    from jax._src import xla_bridge  # the backend registry has no public API

    from fitjax.step.xla_cpu import _backends_started

    if os.environ.get("JAX_PLATFORMS") or jax.config.jax_platforms or _backends_started():
        return False
    factories = getattr(xla_bridge, "_backend_factories", None)
    if not isinstance(factories, dict) or "tpu" not in factories or tpu_may_be_present():
        return False
    del factories["tpu"]
    return True


def deviceless_topology(topology_name: str) -> Any:
    """libtpu's description of a TPU slice (`topology_name` such as "v5e:4x4"), whose devices a
    program compiles for on a machine without them; libtpu's profiler is not registered
    (module docstring). libtpu writes its probe to stderr: the caller decides where that goes."""
    from jax.experimental import topologies

    # libtpu takes a machine-wide lock file for the TPU chips it drives, so a second process
    # (another plan, a test run) would fail; a deviceless compile drives no chip.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    with _plugin_profiler_not_registered():
        return topologies.get_topology_desc(topology_name=topology_name, platform="tpu")


@contextlib.contextmanager
def _plugin_profiler_not_registered() -> Iterator[None]:
    from jax._src import xla_bridge  # where JAX loads a PJRT plugin and registers its profiler

    profiler = getattr(xla_bridge, "_profiler", None)
    register = getattr(profiler, "register_plugin_profiler", None)
    if register is None:  # a JAX that loads plugins otherwise: nothing to keep out
        yield
        return
    profiler.register_plugin_profiler = lambda c_api: None
    try:
        yield
    finally:
        profiler.register_plugin_profiler = register
