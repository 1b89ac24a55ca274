"""`Trainer(accelerator=...)`: which JAX backend a run uses, and the line that says what it used.

The banner goes to the "fitjax" logger at INFO, which prints to stdout unless the application
configured logging itself (as Lightning's "GPU available: ..." lines do). Silence it with
`logging.getLogger("fitjax").setLevel(logging.WARNING)`.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, Sequence

import jax

__all__ = ["ACCELERATORS", "accelerator_devices", "banner", "log"]

#: Lightning's names; "cuda" is Lightning's alias of "gpu" (JAX's "gpu" backend covers CUDA and ROCm).
ACCELERATORS = ("auto", "cpu", "gpu", "tpu", "cuda")

_INSTALL_HINT = {
    "gpu": 'install JAX for NVIDIA GPUs with `pip install -U "jax[cuda12]"` (or JAX\'s ROCm build)',
    "tpu": 'on a TPU VM, install JAX for TPUs with `pip install -U "jax[tpu]"`',
    "cpu": "the CPU backend is always built in: check the JAX_PLATFORMS environment variable",
}

log = logging.getLogger("fitjax")


class _Stdout(logging.StreamHandler):
    """Writes to the current `sys.stdout` (which tests and notebooks swap), message only."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("%(message)s"))

    @property
    def stream(self):  # type: ignore[override]
        return sys.stdout

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler.__init__ assigns it; the property wins
        pass


if not log.handlers and not logging.getLogger().handlers:
    # Like Lightning: info lines are shown unless the application set up logging itself.
    log.addHandler(_Stdout())
    log.setLevel(logging.INFO)
    log.propagate = False


def backends_present() -> list[str]:
    """The JAX backends that initialise here, e.g. ["cpu"] or ["cpu", "gpu"]."""
    present = []
    for name in ("cpu", "gpu", "tpu"):
        try:
            jax.devices(name)
        except RuntimeError:
            continue
        present.append(name)
    return present


def accelerator_devices(accelerator: Any) -> list[jax.Device]:
    """Every device of the backend `accelerator` names ("auto": JAX's default, TPU > GPU > CPU).

    Raises:
        ValueError: `accelerator` is not one of `ACCELERATORS`.
        RuntimeError: the backend is not present; the message lists those that are.
    """
    if not isinstance(accelerator, str) or accelerator not in ACCELERATORS:
        raise ValueError(
            f"Trainer(accelerator=...) must be one of {', '.join(map(repr, ACCELERATORS))}; got "
            f"{accelerator!r}. 'auto' picks the best backend JAX finds (TPU, then GPU, then CPU)."
        )
    if accelerator == "auto":
        return jax.devices()
    backend = "gpu" if accelerator == "cuda" else accelerator
    try:
        return jax.devices(backend)
    except RuntimeError:
        pass
    platforms = os.environ.get("JAX_PLATFORMS")
    limited = f" (JAX_PLATFORMS={platforms!r} limits JAX to those)" if platforms else ""
    raise RuntimeError(
        f"Trainer(accelerator={accelerator!r}): JAX has no {backend} backend on this machine; "
        f"backends present: {', '.join(backends_present()) or 'none'}{limited}. To use it, "
        f"{_INSTALL_HINT[backend]}; or pass accelerator='auto' to use what is there."
    )


def check_devices_match(accelerator: str, devices: Sequence[jax.Device]) -> None:
    """Raises when a list of devices given with `devices=` is not on the asked backend."""
    backend = {"cuda": "gpu"}.get(accelerator, accelerator)
    if accelerator == "auto" or not devices:
        return
    wrong = sorted({d.platform for d in devices} - {backend})
    if wrong:
        raise ValueError(
            f"Trainer(accelerator={accelerator!r}) was given devices on {', '.join(wrong)}: "
            f"{list(devices)!r}. Pass devices of the {backend} backend (jax.devices({backend!r})) "
            f"or accelerator='auto'."
        )


def banner(devices: Sequence[jax.Device], strategy: Any, precision: Any, environment: Any = None) -> str:
    """Two lines that fit 80 columns: platform, devices used of available, processes (the cluster
    environment and this process's rank); then strategy and mesh, precision (a name or a
    `Precision`: "64-true" adds that JAX's x64 is on for the run).

    Example (8 virtual CPU devices, `strategy="dp"`):
        fitjax: cpu, 8/8 devices used, 1 process (LightningEnvironment, rank 0)
          strategy DataParallel (mesh data=8), precision 32-true
    """
    first = devices[0]
    kind = first.platform if first.device_kind.lower() == first.platform else f"{first.platform} ({first.device_kind})"
    available = len(jax.devices(first.platform))
    processes = jax.process_count()
    where = "" if environment is None else f" ({type(environment).__name__}, rank {jax.process_index()})"
    mesh = getattr(strategy, "mesh", None)
    shape = " ".join(f"{axis}={size}" for axis, size in mesh.shape.items()) if mesh is not None else "none"
    return (f"fitjax: {kind}, {len(devices)}/{available} devices used, "
            f"{processes} process{'es' if processes != 1 else ''}{where}\n  strategy {type(strategy).__name__} "
            f"(mesh {shape}), precision {getattr(precision, 'name', precision)}"
            f"{' (x64 enabled)' if getattr(precision, 'x64', False) else ''}")
