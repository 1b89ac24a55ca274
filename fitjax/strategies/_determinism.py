"""`Trainer(deterministic=True)`: what makes two runs of the same code bitwise identical.

Given the same code, data, `seed`, jax/XLA versions, device kind and device count, a fitjax run
is a pure function of its inputs except for:

1. Random bits. fitjax draws every key from `Trainer(seed)` folded with the step, so the only
   requirement is a PRNG whose bits do not depend on how XLA compiles or shards the program:
   `jax_default_prng_impl="threefry2x32"` (the default). `rbg` / `unsafe_rbg` are faster but
   their bits may change with sharding and compiler versions, so they are refused here.
2. Reductions whose order XLA may choose at run time. On CPU and TPU XLA's reductions are
   deterministic. On GPU, scatter-adds and some cuDNN/cuBLAS algorithms use atomics; the flag
   `--xla_gpu_deterministic_ops=true` makes XLA pick deterministic ones (slower). XLA reads
   `XLA_FLAGS` once, when the backend starts, so it is set here when the backend has not started
   yet and an error asks to set it in the environment when it has (on GPU only).
3. Data order: shuffling loaders must be seeded (`fj.DataLoader(..., seed=...)`, the default
   seed is fixed) and host data must be the same.

Changing the number of devices changes the order of the gradient all-reduce, so runs on 1 and 8
devices agree closely but not bitwise.
"""

from __future__ import annotations

import os

import jax

from fitjax._jax_compat import backends_started

_GPU_FLAG = "--xla_gpu_deterministic_ops=true"


def enforce(deterministic: bool) -> bool:
    """Applies (or checks) the settings above; returns `deterministic` (a bool, checked by the
    Trainer with its other flags)."""
    if not deterministic:
        return False
    impl = jax.config.jax_default_prng_impl
    if impl != "threefry2x32":
        raise ValueError(
            f"Trainer(deterministic=True) needs jax_default_prng_impl='threefry2x32', but it is {impl!r}, "
            "whose random bits may depend on sharding and compiler version. Remove "
            "`jax.config.update('jax_default_prng_impl', ...)` (or the JAX_DEFAULT_PRNG_IMPL variable)."
        )
    flags = os.environ.get("XLA_FLAGS", "")
    if _GPU_FLAG in flags:
        return True
    if not backends_started():
        os.environ["XLA_FLAGS"] = f"{flags} {_GPU_FLAG}".strip()
        return True
    if any(d.platform == "gpu" for d in jax.devices()):
        raise RuntimeError(
            "Trainer(deterministic=True) on GPU needs XLA_FLAGS to contain "
            f"{_GPU_FLAG!r} before JAX starts its backend, which has already happened in this process. "
            f"Set it in the environment (`XLA_FLAGS={_GPU_FLAG} python train.py`) or build the Trainer "
            "before any JAX computation."
        )
    return True
