"""How fitjax treats XLA:TPU: the compiler options every TPU program fitjax compiles is given, and
libtpu loaded only where a TPU may be. (The attention kernel a TPU program runs, and its blocks,
are chosen beside the kernels: `fitjax.nn._kernels`.)

**Compiler options (`compiler_options`).** Each program fitjax compiles for a TPU (the train
step, the state's init, the evaluation and predict steps) is given the options of
`DEFAULT_OPTIONS` as per-program compile options (not `LIBTPU_INIT_ARGS`, which is read once per
process), so a fit can be measured with and without each one. The set is empty: an option is
on by default only once a measurement on the chip shows it helps. The one measured,
`xla_tpu_scoped_vmem_limit_kib=98304` (the on-chip vector memory, VMEM: 128 MiB on v5e and v6e,
one fused operation may use as scratch, from XLA's 16-32 MiB to 96 MiB, which MaxText's dense
models on v5e/v6e set), changes the program (GPT-2 small's MLP block compiled for a v5e chip
plans 126 MB of scratch with it instead of 201 MB, different fusions) and cost fitjax's GPT-2
small step 9%: 0.91x the same fit without it (`benchmarks/results/tpu-v5e/gpt-bf9c4ab.json`,
`benchmarks/gpt.py --tpu-options SPEC` measures an option); without it fitjax's step is the
hand-written loop's program. Everything else in MaxText's v5e scripts overlaps collectives
(all-gathers, all-reduces) across chips, which one chip does not run.

The set is read from `FITJAX_XLA_TPU_OPTIONS` when a program is built, so each option can be
switched for one run:

    FITJAX_XLA_TPU_OPTIONS=xla_tpu_scoped_vmem_limit_kib=98304    # one added (or a default changed)
    FITJAX_XLA_TPU_OPTIONS=-xla_tpu_scoped_vmem_limit_kib         # the defaults less one
    FITJAX_XLA_TPU_OPTIONS=none                                   # fitjax adds no option
    FITJAX_XLA_TPU_OPTIONS="none,xla_tpu_enable_latency_hiding_scheduler=true"   # only this one

Entries are separated by commas or spaces; `none` drops the defaults, `-name` drops one,
`name=value` (or XLA's flag form `--name=value`) adds or replaces one. An option the user passes for a program (`compiler_options`'
`options`) wins over these. Other platforms get nothing from here.

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
import dataclasses
import glob
import os
from typing import Any, Iterator

__all__ = ["DEFAULT_OPTIONS", "OPTIONS_ENV", "compiler_options", "deviceless_topology", "options_from",
           "skip_absent_tpu", "tpu_may_be_present"]

OPTIONS_ENV = "FITJAX_XLA_TPU_OPTIONS"

# (name, value): the module docstring says why each is on; none yet (measured first)
DEFAULT_OPTIONS: dict[str, Any] = {}


def options_from(spec: str | None, defaults: dict[str, Any] | None = None) -> dict[str, Any]:
    """The options a `FITJAX_XLA_TPU_OPTIONS` value (`spec`; None: unset) makes of `defaults`
    (`DEFAULT_OPTIONS` when None). Values stay strings, as XLA parses its flags.

    Example:
        >>> from fitjax.step import xla_tpu
        >>> xla_tpu.options_from("-xla_tpu_scoped_vmem_limit_kib, xla_tpu_a=true")
        {'xla_tpu_a': 'true'}
    """
    options = dict(DEFAULT_OPTIONS if defaults is None else defaults)
    for entry in (spec or "").replace(",", " ").split():
        if entry == "none":
            options.clear()
        elif entry.startswith("-") and "=" not in entry:
            options.pop(entry.lstrip("-"), None)
        elif "=" in entry and entry.split("=", 1)[0]:
            name, value = entry.split("=", 1)
            options[name.lstrip("-")] = value
        else:
            raise ValueError(f"{OPTIONS_ENV}={spec!r}: entry {entry!r} is not one of 'none', '-name' or "
                             f"'name=value' (entries separated by commas or spaces), e.g. "
                             f"{OPTIONS_ENV}='-xla_tpu_scoped_vmem_limit_kib'")
    return options


def compiler_options(platform: str, options: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """`options` for a program compiled for `platform`: on "tpu", fitjax's TPU options
    (`FITJAX_XLA_TPU_OPTIONS`, module docstring) under them; elsewhere `options` unchanged."""
    if platform != "tpu":
        return options
    chosen = {**options_from(os.environ.get(OPTIONS_ENV)), **(options or {})}
    return chosen or None


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
    # kept as a known platform whose backend quietly fails to start: code that lowers for "tpu"
    # without running there (Pallas' TPU kernels in its interpreter, a deviceless compile for a
    # slice) registers its rules for a platform JAX must still know
    factories["tpu"] = dataclasses.replace(factories["tpu"], factory=_no_tpu, fail_quietly=True)
    return True


def _no_tpu() -> None:
    raise RuntimeError("fitjax: no TPU on this machine (no TPU device, no TPU_* variable): libtpu was not "
                       "started; set JAX_PLATFORMS=tpu to start it anyway")


def deviceless_topology(topology_name: str) -> Any:
    """libtpu's description of a TPU slice (`topology_name` such as "v5e:4x4"), whose devices a
    program compiles for on a machine without them; libtpu's profiler is not registered
    (module docstring). libtpu writes its probe to stderr: the caller decides where that goes."""
    from jax.experimental import topologies

    # libtpu takes a machine-wide lock file for the TPU chips it drives, so a second process
    # (another plan, a test run) would fail; a deviceless compile drives no chip.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    # one chip is its own host: libtpu's default host of 2x2x1 chips does not divide a 1x1 slice
    # (the libtpu jax pins, 0.0.42, refuses it; later ones assume it)
    dims = [int(d) for d in topology_name.split(":", 1)[-1].split("x")]
    single = {"chips_per_host_bounds": (1, 1, 1)} if all(d == 1 for d in dims) else {}
    with _plugin_profiler_not_registered():
        return topologies.get_topology_desc(topology_name=topology_name, platform="tpu", **single)


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
