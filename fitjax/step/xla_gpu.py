"""How fitjax compiles for XLA:GPU: the state's initialisation draws its random numbers in a kernel.

A model's `init` draws every parameter from the PRNG. JAX lowers its default PRNG (threefry)
to plain XLA operations, and XLA:GPU compiles each draw into a large kernel of its own: on one
H200, GPT-2 small's `init` (99 parameter arrays) compiled in 34-40 s, in a hand-written loop
(`jax.jit(model.init)`) as much as in `fit`, against 7 s on a 2-core CPU. JAX can instead lower
threefry on GPU to one precompiled CUDA/ROCm kernel (the `jax_threefry_gpu_kernel_lowering`
option): the same algorithm on the same keys, so the same bits, and that `init` compiled in
2.6 s. JAX's own note on the option names its cost: draws are not fused into the operations that
use them, so a program holding many draws may need more memory while it runs. That is nothing for
an init, which returns the values it draws, but it could be for a train step's dropout, so only
the state's initialisation lowers this way (`rng_kernels`); the user's global choice is left as
it is, and other platforms are unchanged. `python benchmarks/init_compile.py` measures both
lowerings and checks the bits are equal.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from jax._src import config as _jax_config  # the option's context manager is not exported

__all__ = ["rng_kernels"]


@contextlib.contextmanager
def rng_kernels(platform: str) -> Iterator[None]:
    """While entered on "gpu", programs traced and compiled lower threefry to JAX's GPU kernel;
    elsewhere (or on a JAX without the option) nothing changes."""
    option = getattr(_jax_config, "threefry_gpu_kernel_lowering", None)
    if platform != "gpu" or option is None:
        yield
        return
    with option(True):
        yield
