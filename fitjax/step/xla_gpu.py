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

**Attention (`cudnn_attention`).** On an NVIDIA GPU, `fj.nn.attention(implementation="auto")`
runs cuDNN's fused flash attention (`jax.nn.dot_product_attention(implementation="cudnn")`)
where that kernel takes the arguments: bfloat16 or float16 inputs, a head_dim that is a multiple
of 8 up to 128, no segment ids, no `positions` pair, no soft cap, a local window only with
the causal mask, and equal query and key lengths when a causal or local mask applies (cuDNN aligns the mask at the top-left; fitjax's
queries are the last positions of the keys'). Elsewhere the plain path runs.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import jax.numpy as jnp

from fitjax._jax_compat import threefry_gpu_kernel_lowering

__all__ = ["cudnn_attention", "rng_kernels"]


@contextlib.contextmanager
def rng_kernels(platform: str) -> Iterator[None]:
    """While entered on "gpu", programs traced and compiled lower threefry to JAX's GPU kernel;
    elsewhere (or on a JAX without the option) nothing changes."""
    option = threefry_gpu_kernel_lowering()
    if platform != "gpu" or option is None:
        yield
        return
    with option(True):
        yield


_CUDNN_DTYPES = (jnp.bfloat16, jnp.float16)
_CUDNN_HEAD_DIM = 128


def cudnn_attention(*, dtype: Any, q_length: int, kv_length: int, head_dim: int, causal: bool,
                    sliding_window: int | None, segment_ids: Any, positions: Any,
                    logit_softcap: float | None) -> bool:
    """Whether cuDNN's fused attention computes `fj.nn.attention` for these arguments (module
    docstring)."""
    masked = causal or sliding_window is not None
    return (jnp.dtype(dtype) in _CUDNN_DTYPES and head_dim % 8 == 0 and head_dim <= _CUDNN_HEAD_DIM
            and segment_ids is None and positions is None and logit_softcap is None
            and (not masked or q_length == kv_length) and (sliding_window is None or causal))
