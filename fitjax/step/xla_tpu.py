"""How fitjax compiles for XLA:TPU: the compiler options every TPU program fitjax compiles is given,
and a TPU slice's topology to compile for without one. (The attention kernel a TPU program runs,
and its blocks, are chosen beside the kernels: `fitjax.nn._kernels`; keeping libtpu out of a
process without a TPU is the bootstrap's, at `import fitjax`: `fitjax._bootstrap`.)

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

**A TPU topology without a TPU (`deviceless_topology`).** The planner's TPU targets need libtpu
on any machine: it describes a slice (`jax.experimental.topologies`, which loads libtpu outside
the backends) and XLA compiles for it. JAX registers libtpu's profiler as it loads it, and that
profiler crashes the process at the next `jax.profiler` trace (`fitjax._bootstrap`; a plan, then
a profiled fit in one process: exit 139; libtpu 0.0.52 says "Unexpected PLUGIN_Profiler_Api size: expected
80, got 104" first: it was built against another jaxlib than 0.10.2). `deviceless_topology`
loads libtpu without registering its profiler: a process with no TPU has nothing for it to
trace. Where libtpu is already loaded (a TPU backend), nothing is loaded or registered again.
"""

from __future__ import annotations

import os
from typing import Any

from fitjax import _jax_compat

__all__ = ["DEFAULT_OPTIONS", "OPTIONS_ENV", "compiler_options", "deviceless_topology", "options_from"]

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
    with _jax_compat.plugin_profiler_not_registered():
        return topologies.get_topology_desc(topology_name=topology_name, platform="tpu", **single)
