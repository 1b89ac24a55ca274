"""Every place fitjax reaches into JAX's private modules (`jax._src`), by name, in one room.

JAX promises nothing about `jax._src`: a release may move or rename what is here. Each function
below says what it reaches, why no public API does the same, and what it does where the private
has moved: the caller's fallback (None, False) where fitjax can do without, else
`JaxPrivateMissing`, an `ImportError` that names the private and the JAX release fitjax was
checked with. tests/test_jax_compat.py checks each on the installed JAX, and that no other module
of fitjax names `jax._src`.

Checked with jax and jaxlib 0.10.2 (`CHECKED_WITH`: the development machines and the TPU VM).

This module imports nothing of JAX's at its import (`fitjax._ctrl_c` and `fitjax._bootstrap`
read it before JAX is imported); each function imports what it reaches when called.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from typing import Any, Callable, Iterator

__all__ = ["CALLBACK_FILE", "CALLBACK_FUNCTION", "CHECKED_WITH", "COMPILE_FILE", "COMPILE_FUNCTIONS",
           "JaxPrivateMissing", "backend_factories", "backends_started", "batching_rules", "distributed_client",
           "hlo_module_cost_analysis", "plugin_profiler_not_registered", "threefry_gpu_kernel_lowering",
           "tpu_chips_on_pci"]

CHECKED_WITH = "0.10.2"

# Frames matched by file and function name (`fitjax._ctrl_c`), never imported: that module runs
# before JAX is imported. Where JAX waits for XLA to compile (`jax._src.compiler`):
COMPILE_FILE = os.path.join("jax", "_src", "compiler.py")
COMPILE_FUNCTIONS = frozenset({"backend_compile_and_load", "backend_compile"})  # 0.10 has the first
# Where XLA's runtime runs a host callback (`jax.debug.callback`, `io_callback`, `pure_callback`):
CALLBACK_FILE = os.path.join("jax", "_src", "callback.py")
CALLBACK_FUNCTION = "_wrapped_callback"


class JaxPrivateMissing(ImportError):
    """A private of JAX's that fitjax reaches is not where it was in the JAX fitjax was checked with."""


def _private(name: str, why: str) -> Any:
    """`jax._src.<name>`, or `JaxPrivateMissing` saying which private, why fitjax reaches it and
    which JAX release fitjax was checked with."""
    try:
        return importlib.import_module(f"jax._src.{name}")
    except ImportError as error:
        import jax

        raise JaxPrivateMissing(
            f"fitjax reaches JAX's private module jax._src.{name} ({why}), which jax {jax.__version__} does "
            f"not have ({error}); fitjax was checked with jax {CHECKED_WITH}: install jax=={CHECKED_WITH} "
            "or a fitjax release that supports this JAX") from error


def backends_started() -> bool:
    """Whether JAX has started its backends (`jax._src.xla_bridge.backends_are_initialized`).

    No public API answers this: `jax.devices()` starts them. fitjax asks before changing what is
    read when they start (`XLA_FLAGS`, the backend factories). Where the function moved, whether
    the private backend cache is filled; where that moved too, `JaxPrivateMissing`.
    """
    xla_bridge = _private("xla_bridge", "whether JAX's backends have started")
    started = getattr(xla_bridge, "backends_are_initialized", None)
    return bool(started()) if started is not None else bool(getattr(xla_bridge, "_backends", None))


def backend_factories() -> dict[str, Any] | None:
    """JAX's registry of backend factories by platform (`jax._src.xla_bridge._backend_factories`,
    each a `BackendRegistration`), the dict itself (changes to it are JAX's), or None where this
    JAX keeps it elsewhere or otherwise.

    No public API lists or replaces a backend before the backends start; the bootstrap replaces
    the TPU's where no TPU is present (`fitjax._bootstrap`).
    """
    try:
        xla_bridge = _private("xla_bridge", "the registry of backend factories")
    except JaxPrivateMissing:
        return None
    factories = getattr(xla_bridge, "_backend_factories", None)
    return factories if isinstance(factories, dict) else None


def tpu_chips_on_pci() -> int | None:
    """How many TPU chips are on this machine's PCI bus (`jax._src.hardware_utils`, the scan JAX
    runs at import), or None where it cannot tell (the scan moved, or it failed).

    JAX exposes no public name for the scan; reading the PCI bus again would copy JAX's table of
    TPU device ids, which moves with each TPU generation.
    """
    try:
        hardware_utils = _private("hardware_utils", "the PCI scan for TPU chips")
        return int(hardware_utils.num_available_tpu_chips_and_device_id()[0])
    except (ImportError, AttributeError, OSError):
        return None


@contextlib.contextmanager
def plugin_profiler_not_registered() -> Iterator[None]:
    """While entered, a PJRT plugin JAX loads (libtpu, for a deviceless TPU topology) does not
    register its profiler (`jax._src.xla_bridge._profiler.register_plugin_profiler` is replaced by
    a no-op, and restored on exit).

    No public API loads a plugin without its profiler, and libtpu's profiler crashes the process
    at the next `jax.profiler` trace on a machine without a TPU (`fitjax.step.xla_tpu`). Where
    this JAX registers plugins otherwise, nothing is kept out.
    """
    try:
        xla_bridge = _private("xla_bridge", "where JAX loads a PJRT plugin and registers its profiler")
    except JaxPrivateMissing:
        xla_bridge = None
    profiler = getattr(xla_bridge, "_profiler", None)
    register = getattr(profiler, "register_plugin_profiler", None)
    if register is None:
        yield
        return
    profiler.register_plugin_profiler = lambda c_api: None
    try:
        yield
    finally:
        profiler.register_plugin_profiler = register


def distributed_client() -> Any:
    """The client of `jax.distributed`'s runtime (`jax._src.distributed.global_state.client`):
    its key-value store and barriers, None when `jax.distributed.initialize` was not called.

    JAX exposes the key-value store only privately; fitjax's processes agree on a stop step, a
    watchdog's report and a shared tokens cache through it. Where it moved: `JaxPrivateMissing`
    (a multi-process run cannot agree without it).
    """
    distributed = _private("distributed", "the key-value store of jax.distributed's runtime")
    try:
        return distributed.global_state.client
    except AttributeError as error:
        raise JaxPrivateMissing(f"jax._src.distributed has no global_state.client ({error}); fitjax was checked "
                                f"with jax {CHECKED_WITH}") from error


def threefry_gpu_kernel_lowering() -> Callable[[bool], Any] | None:
    """JAX's `jax_threefry_gpu_kernel_lowering` option as a context manager factory
    (`jax._src.config.threefry_gpu_kernel_lowering(True)`), or None where this JAX has none.

    The option's global switch is public (`jax.config.update`), its scoped form is not; fitjax
    lowers only the state's initialisation this way (`fitjax.step.xla_gpu`).
    """
    try:
        config = _private("config", "the scoped form of jax_threefry_gpu_kernel_lowering")
    except JaxPrivateMissing:
        return None
    return getattr(config, "threefry_gpu_kernel_lowering", None)


def batching_rules() -> dict[Any, Callable]:
    """JAX's batching rules by primitive (`jax._src.interpreters.batching.fancy_primitive_batchers`,
    the dict itself), which `vmap` reads for each primitive it meets.

    JAX has no public way to change a primitive's batching rule; fitjax puts one in front of the
    convolution's on CPU (`fitjax.step.xla_cpu.runs_vmap`). Where it moved: `JaxPrivateMissing`
    (an `ImportError`: the caller keeps JAX's rule).
    """
    batching = _private("interpreters.batching", "the batching rules vmap reads")
    rules = getattr(batching, "fancy_primitive_batchers", None)
    if not isinstance(rules, dict):
        raise JaxPrivateMissing(f"jax._src.interpreters.batching has no fancy_primitive_batchers dict; fitjax "
                                f"was checked with jax {CHECKED_WITH}")
    return rules


def hlo_module_cost_analysis(client: Any, module: Any) -> dict[str, float]:
    """XLA's cost analysis of an HLO module that was never compiled
    (`jax._src.lib._jax.hlo_module_cost_analysis`): the FLOPs, bytes and transcendentals of one
    loop body on its own (`fitjax.step.hlo_loops`).

    JAX's public `cost_analysis()` is a compiled program's, which counts a loop's body once.
    Where it moved: `JaxPrivateMissing` (the caller keeps XLA's own figures).
    """
    lib = _private("lib", "XLA's cost analysis of an uncompiled HLO module")
    analysis = getattr(getattr(lib, "_jax", None), "hlo_module_cost_analysis", None)
    if analysis is None:
        raise JaxPrivateMissing(f"jax._src.lib._jax has no hlo_module_cost_analysis; fitjax was checked with "
                                f"jax {CHECKED_WITH}")
    return analysis(client, module)
