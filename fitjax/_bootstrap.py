"""What `import fitjax` does to the process, all of it, and how to keep it from doing any of it.

`fitjax/__init__.py` calls `start()` first thing, before JAX is imported, and `imported()` last.
With the default, `start()` makes three process-wide changes, each needed because what it
changes is read once, before any fitjax code the user calls could set it:

**1. Ctrl-C (`fitjax._ctrl_c.install`: a SIGINT handler and a garbage-collector callback).** In
a script's main thread where Python's default handler is set (an interactive session or a
notebook keeps Python's), a Ctrl-C ends the script with status 130 and no traceback, wherever it
lands: during `import jax` (where Python would turn it into an `ImportError`), in JAX's
garbage-collection callbacks (where Python prints "Exception ignored" and loses it: the script
trained to the end), inside XLA's compilation (where leaving crashes the exit). A callback put
first in `gc.callbacks` tells the handler when a collection is under way. `fitjax._ctrl_c` says
how; it must be set before `import jax`, which is the first place a Ctrl-C is lost.

**2. XLA:CPU's depth-first scheduler (`prefer_depth_first_scheduler`: `XLA_FLAGS`).** XLA:CPU orders
each program's operations with one of two schedulers: a breadth-first one "optimised for
concurrency" (its default) or a depth-first, memory-frugal one. On a small train step the
breadth-first order makes anything that reads every gradient (a global-norm clip, a grad-norm log)
cost the step half its speed: a hand-written tiny-MLP step clipped at 1.0 ran 0.43-0.56x the
unclipped one, 0.8-0.9x with the depth-first scheduler; the MNIST-sized MLP's 0.88x and 0.99x;
unclipped steps unchanged (`python benchmarks/clip_norm.py [--size mnist]` prints both schedulers).
The choice is read from `XLA_FLAGS` once, when JAX starts its backends; a per-compile option does
not change it (measured: the same program text). So `prefer_depth_first_scheduler()` appends
`--xla_cpu_enable_concurrency_optimized_scheduler=false` to `XLA_FLAGS` when JAX's backends have not
started, `XLA_FLAGS` does not already name the flag (a user's own choice stands: set it to `true` to
keep XLA's default) and jaxlib is a release it was checked with (XLA aborts on an unknown flag:
`_CHECKED_UP_TO`). It changes the order operations run in, not what they compute (a clipped fit
gives the same bits under both: tests/step/test_xla_cpu.py), and only XLA:CPU programs (GPU and TPU
ignore it).

**3. No TPU, no libtpu (`skip_absent_tpu`: JAX's backend factories).** `pip install "fitjax[dev]"`
(and `[tpu-plan]`) installs libtpu so that `fitjax plan --target tpu-...` compiles for a TPU slice
on any machine. JAX then tries libtpu as a backend when it starts its backends, on every machine: on
one without a TPU libtpu prints its probe ("Failed to find host bounds for accelerator type", an
`E0000 ... INVALID_ARGUMENT` with a "Source Location Trace": 6-12 lines on stderr) before the
program's first line, and it registers its profiler, which then kills the process with a
segmentation fault when `Trainer(profiler="jax")` starts a trace (measured: exit 139 on a 2-core CPU
machine with libtpu 0.0.52, jax 0.10.2; the same fit profiles fine without libtpu).

So `skip_absent_tpu()` takes the TPU out of the backends JAX will try when nothing says a TPU is
here: no TPU chip on the PCI bus (the check JAX itself runs at import), no `/dev/accel*` or
`/dev/vfio/*` device (how TPU VMs expose the chips), no `TPU_*` variable set by the machine or the
user (`TPU_ACCELERATOR_TYPE`, `TPU_WORKER_HOSTNAMES`, ...; not those JAX and libtpu set on every
machine, `_SET_EVERYWHERE`), no `JAX_FORCE_TPU_INIT`, and no platform list chosen by the user
(`JAX_PLATFORMS` or `jax.config.update("jax_platforms", ...)`: their choice stands, probe included).
JAX does the same for CUDA (it skips the CUDA backend when no NVIDIA device file exists); GPUs and
every other backend are untouched, and a TPU VM keeps its TPU with no setting. Nothing changes once
JAX's backends have started (a program that used JAX before importing fitjax keeps what JAX found).

**Opting out: `FITJAX_BOOTSTRAP=0`.** With the variable set to `0` (or `false`, `no`, `off`)
before `import fitjax`, `start()` changes nothing: no SIGINT handler (Python's `KeyboardInterrupt`
stays; `Trainer.fit` still sets its own graceful handler while it runs, and removes it after),
no `gc.callbacks` entry, `XLA_FLAGS` as it was (XLA:CPU's default scheduler) and JAX's backend
factories as JAX made them (libtpu, where installed, is tried and prints its probe). The variable
is read before anything is changed. tests/test_bootstrap.py imports fitjax in a fresh process
and compares the signal handler, `gc.callbacks`, the environment and JAX's backend factories
before and after, with and without the variable.
"""

from __future__ import annotations

import dataclasses
import glob
import os

from fitjax import _ctrl_c, _jax_compat

__all__ = ["OPT_OUT_VAR", "SCHEDULER_FLAG", "enabled", "imported", "prefer_depth_first_scheduler",
           "skip_absent_tpu", "start", "tpu_may_be_present"]

OPT_OUT_VAR = "FITJAX_BOOTSTRAP"
_OFF = ("0", "false", "no", "off")


def enabled() -> bool:
    """Whether `import fitjax` may change the process: `FITJAX_BOOTSTRAP` is not set to 0 (module
    docstring)."""
    return os.environ.get(OPT_OUT_VAR, "").strip().lower() not in _OFF


def start() -> None:
    """The bootstrap's three changes (module docstring), in order, unless opted out: Ctrl-C's
    handler before JAX is imported, then what JAX reads when it starts its backends."""
    if not enabled():
        return
    _ctrl_c.install()
    prefer_depth_first_scheduler()
    skip_absent_tpu()


def imported() -> None:
    """At the end of `import fitjax`: a Ctrl-C held during the imports is raised now (nothing is
    ever held when opted out: no handler was set)."""
    _ctrl_c.imported()


SCHEDULER_FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler=false"
# XLA aborts the process on a flag it does not know, so the flag is set only for the jaxlib
# releases it was checked with (its reader has been in XLA:CPU since before jax 0.6, the oldest
# fitjax supports); a newer jaxlib keeps XLA's default until this is raised after a check.
_CHECKED_UP_TO = (0, 10)


def prefer_depth_first_scheduler() -> bool:
    """Asks XLA:CPU for its depth-first scheduler (module docstring, 2.); True when the flag was
    added to `XLA_FLAGS` now. Does nothing when `XLA_FLAGS` already names the flag or when JAX's
    backends have started (the flags are read then, so a late change would only mislead)."""
    flags = os.environ.get("XLA_FLAGS", "")
    if SCHEDULER_FLAG.split("=")[0] in flags or not _checked_jaxlib() or _jax_compat.backends_started():
        return False
    os.environ["XLA_FLAGS"] = f"{flags} {SCHEDULER_FLAG}".strip()
    return True


def _checked_jaxlib() -> bool:
    import jaxlib

    try:
        release = tuple(int(part) for part in jaxlib.__version__.split(".")[:2])
    except ValueError:  # a development build: its flags are unknown
        return False
    return release <= _CHECKED_UP_TO


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
    chips = _jax_compat.tpu_chips_on_pci()
    # cannot tell: assume a TPU may be here (the probe is noise; a lost TPU is not)
    return 1 if chips is None else chips


def skip_absent_tpu() -> bool:
    """Takes the TPU out of the backends JAX tries when no TPU may be present (module docstring, 3.);
    True when it did so now. Does nothing when the user chose JAX's platforms or when JAX's
    backends have started."""
    import jax

    if os.environ.get("JAX_PLATFORMS") or jax.config.jax_platforms or _jax_compat.backends_started():
        return False
    factories = _jax_compat.backend_factories()
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
