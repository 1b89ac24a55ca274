"""`attention`: multi-head attention with causal, packed-segment, sliding-window and soft-capped
masks, through one signature whatever runs it.

Every model fitjax ships (the GPT example, the imported GPT-2, Llama, Qwen, Mistral and Gemma
models) and the generation program call this one function, so a faster kernel reaches all of
them at once. `implementation="auto"` picks per platform (the TPU kernel's choice and blocks in
`fitjax.nn._kernels`, cuDNN's in `fitjax.step.xla_gpu`); `"xla"` is the plain path: scores in float32, materialised as
[batch, heads, query length, key length], which every platform runs and every kernel is tested
against.

What "auto" runs, by the platform the call is traced for (`fitjax._platform.traced_platform()`:
the devices of the strategy compiling the program, else `jax.default_backend()`):
- TPU: JAX's Pallas splash attention kernel (`fitjax.nn._splash`) where its constraints hold
  (`_kernels.splash_blocks`: lengths multiples of 128, head_dim a multiple of 64, one segment-id
  array, no `positions`); `FITJAX_TPU_ATTENTION=xla` turns it off. The kernel keeps no
  [q_length, kv_length] scores in HBM, and skips the blocks its mask hides (half of a causal
  square). Under a mesh of several devices (a strategy's program, or the user's `jax.set_mesh`)
  it runs inside `jax.shard_map`, batch split over `data`/`fsdp` and heads over `tensor`, with no
  collective; where the mesh cannot split it, the plain path, said once in the log.
- GPU (CUDA): cuDNN's fused attention where it takes the arguments (`xla_gpu.cudnn_attention`).
- Anything else, or outside those constraints: the plain path.
So a TPU program compiled on a CPU machine (the planner's `--target tpu-...`) traces the
kernel, as the chip will run it. A user's own `jax.jit` outside fitjax's strategies is traced for
the default backend: one for other devices of the process should pass `implementation="xla"`,
and one over several TPU chips should trace under its mesh (`with jax.set_mesh(mesh):`), without
which the kernel cannot be compiled for them.
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp

from fitjax._platform import traced_platform
from fitjax.nn import _kernels
from fitjax.nn._splash import mesh_layout, say_once, splash_attention
from fitjax.step import xla_gpu

__all__ = ["attention", "attention_mask"]

Implementation = Literal["auto", "xla", "pallas", "pallas-fused", "cudnn"]
IMPLEMENTATIONS = _kernels.IMPLEMENTATIONS

# a large finite negative (not -inf): a query whose every key is masked (a padding row) gets a
# uniform average instead of NaNs, and its gradient stays finite
_MASKED = -0.7 * float(jnp.finfo(jnp.float32).max)


def _pair(value: jax.Array | tuple[jax.Array, jax.Array] | None) -> tuple[jax.Array | None, jax.Array | None]:
    if value is None or isinstance(value, tuple):
        return value if value is not None else (None, None)
    return value, value


def attention_mask(q_length: int, kv_length: int, *, batch: int = 1, causal: bool = True,
                   segment_ids: jax.Array | tuple[jax.Array, jax.Array] | None = None,
                   positions: tuple[jax.Array, jax.Array] | None = None,
                   sliding_window: int | None = None) -> jax.Array:
    """The boolean mask [batch, 1, q_length, kv_length] `attention` applies: True where a query
    may attend to a key. Arguments as for `attention`."""
    if positions is None:
        # queries are the last `q_length` of the keys' positions (a chunk continuing a prefix)
        q_pos = jnp.arange(q_length)[None, :] + (kv_length - q_length)
        kv_pos = jnp.arange(kv_length)[None, :]
    else:
        q_pos, kv_pos = positions
    allowed = jnp.ones((batch, q_length, kv_length), bool)
    if causal:
        allowed &= kv_pos[:, None, :] <= q_pos[:, :, None]
    if sliding_window is not None:
        allowed &= q_pos[:, :, None] - kv_pos[:, None, :] < sliding_window
    q_seg, kv_seg = _pair(segment_ids)
    if q_seg is not None:
        allowed &= q_seg[:, :, None] == kv_seg[:, None, :]
    return allowed[:, None]


def attention(query: jax.Array, key: jax.Array, value: jax.Array, *, causal: bool = True,
              segment_ids: jax.Array | tuple[jax.Array, jax.Array] | None = None,
              positions: tuple[jax.Array, jax.Array] | None = None,
              sliding_window: int | None = None, logit_softcap: float | None = None,
              scale: float | None = None, implementation: Implementation = "auto") -> jax.Array:
    """Softmax attention of `query` over `key`/`value`: [batch, q_length, heads, head_dim].

    Args:
        query: [batch, q_length, heads, head_dim].
        key: [batch, kv_length, kv_heads, head_dim]; `heads` a multiple of `kv_heads`
            (grouped-query attention: each key/value head serves `heads // kv_heads` query heads).
        value: as `key`.
        causal: a query attends only to keys at its position or before.
        segment_ids: int [batch, length] (queries and keys alike) or a pair (query ids
            [batch, q_length], key ids [batch, kv_length]): a query attends only to keys of its own
            segment, so documents packed into one row never see each other. Padding gets an id of
            its own (0 by convention).
        positions: a pair (query positions [batch, q_length], key positions [batch, kv_length])
            that `causal` and `sliding_window` compare, for a query chunk inside a longer buffer
            (generation with a KV cache). Without it the queries are the last `q_length` positions
            of the keys'.
        sliding_window: a query at position p attends to keys at positions above p - window
            (Mistral's and Gemma's local layers).
        logit_softcap: scores become `cap * tanh(scores / cap)` before the mask (Gemma 2).
        scale: multiplies the scores; 1 / sqrt(head_dim) when None.
        implementation: what computes it (models take it as their `attention` hyperparameter):
            - "auto": the platform's fastest for these arguments (module docstring): on a TPU
              the splash kernel where it applies, on a CUDA GPU cuDNN's, else "xla".
            - "xla": the plain path, every platform (XLA partitions it over any mesh).
            - "pallas": the TPU splash kernel (interpreted, slowly, off TPU), split over the
              mesh the program is traced under (`fitjax.nn._splash`).
            - "pallas-fused": "pallas" with the kernel's fused backward (dq, dk, dv in one).
            - "cudnn": the GPU kernel.
            "pallas" and "cudnn" raise where their kernel cannot compute these arguments; where
            the mesh cannot split the kernel (batch or heads not divisible by its axes) the
            plain path runs, said once in the log. On a TPU `FITJAX_TPU_ATTENTION` ("xla",
            "splash", "splash-fused") overrides this argument (`fitjax.nn._kernels`).

    Example:
        >>> import jax.numpy as jnp, fitjax as fj
        >>> q = k = v = jnp.ones((2, 8, 4, 16))
        >>> packed = jnp.array([[1, 1, 1, 2, 2, 2, 2, 0]] * 2)   # two documents and a pad
        >>> fj.nn.attention(q, k, v, segment_ids=packed).shape
        (2, 8, 4, 16)
    """
    _check(query, key, value, implementation)
    chosen = _choose(implementation, query, key, causal=causal, segment_ids=segment_ids, positions=positions,
                     sliding_window=sliding_window, logit_softcap=logit_softcap)
    if isinstance(chosen, _kernels.SplashBlocks):
        layout, unsplit = mesh_layout(query.shape[0], query.shape[2], key.shape[2])
        if not unsplit:
            ids = segment_ids[0] if isinstance(segment_ids, tuple) else segment_ids
            return splash_attention(query, key, value, causal=causal, segment_ids=ids, sliding_window=sliding_window,
                                    logit_softcap=logit_softcap, scale=scale, blocks=chosen,
                                    interpret=traced_platform() != "tpu", layout=layout)
        say_once(unsplit)
    if chosen == "cudnn":
        window = None if sliding_window is None else (sliding_window - 1, 0)  # causal only (`xla_gpu`)
        return jax.nn.dot_product_attention(query, key, value, scale=scale, is_causal=causal,
                                            local_window_size=window, implementation="cudnn")
    return _plain(query, key, value, causal=causal, segment_ids=segment_ids, positions=positions,
                  sliding_window=sliding_window, logit_softcap=logit_softcap, scale=scale)


def _choose(implementation: str, query: jax.Array, key: jax.Array, *, causal, segment_ids, positions,
            sliding_window, logit_softcap) -> _kernels.SplashBlocks | str:
    """The splash kernel's blocks, "cudnn" or "xla": what computes this call."""
    platform = traced_platform()
    implementation, fused = _kernels.attention_kernel(implementation, platform)
    if implementation == "xla":
        return "xla"
    if implementation in ("auto", "pallas"):
        unsupported, blocks = _splash_unsupported(query, key, segment_ids, positions, fused)
        if implementation == "pallas" and unsupported:
            raise ValueError(f"attention(implementation='pallas'): the TPU kernel does not take {unsupported}; "
                             f"use implementation='auto' (the plain path where the kernel does not apply)")
        if implementation == "pallas" or (platform == "tpu" and blocks is not None):
            return blocks
    cudnn = platform == "gpu" and xla_gpu.cudnn_attention(
        dtype=query.dtype, q_length=query.shape[1], kv_length=key.shape[1], head_dim=query.shape[-1],
        causal=causal, sliding_window=sliding_window, segment_ids=segment_ids, positions=positions,
        logit_softcap=logit_softcap)
    if implementation == "cudnn" and not cudnn:
        raise ValueError(f"attention(implementation='cudnn') runs on a CUDA GPU (this is {platform!r}) with "
                         f"bfloat16/float16 inputs (got {query.dtype}), head_dim a multiple of 8 up to 128 (got "
                         f"{query.shape[-1]}), no segment_ids, positions or logit_softcap, and equal lengths "
                         f"under a mask; use implementation='auto'")
    return "cudnn" if cudnn else "xla"


def _splash_unsupported(query, key, segment_ids, positions, fused: bool
                        ) -> tuple[str, _kernels.SplashBlocks | None]:
    """(what the splash kernel cannot take here, "" if nothing; its blocks where it can)."""
    q_length, head_dim, kv_length = query.shape[1], query.shape[-1], key.shape[1]
    blocks = _kernels.splash_blocks(q_length, kv_length, head_dim, fused_backward=fused)
    if positions is not None:
        reason = "positions (a query chunk in a cache buffer)"
    elif isinstance(segment_ids, tuple) and segment_ids[0] is not segment_ids[1]:
        reason = "a (query ids, key ids) pair of segment_ids (one array for both)"
    elif kv_length < q_length:
        reason = f"fewer keys ({kv_length}) than queries ({q_length})"
    elif blocks is None:
        reason = (f"lengths {q_length}, {kv_length} and head_dim {head_dim} (lengths must be multiples of 128, "
                  f"head_dim a multiple of 64)")
    else:
        return "", blocks
    return reason, None


def _check(query: jax.Array, key: jax.Array, value: jax.Array, implementation: str) -> None:
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"attention(implementation={implementation!r}) must be one of {IMPLEMENTATIONS}")
    if query.ndim != 4 or key.ndim != 4 or value.shape != key.shape:
        raise ValueError(f"attention(query, key, value): expected query [batch, length, heads, head_dim] and key, "
                         f"value of one shape [batch, length, kv_heads, head_dim]; got query {query.shape}, "
                         f"key {key.shape}, value {value.shape}")
    if query.shape[2] % key.shape[2] or query.shape[-1] != key.shape[-1] or query.shape[0] != key.shape[0]:
        raise ValueError(f"attention(query, key, value): query {query.shape} and key {key.shape} must share batch "
                         f"and head_dim, and the query's heads must be a multiple of the key's")


def _plain(query, key, value, *, causal, segment_ids, positions, sliding_window, logit_softcap, scale):
    batch, q_length, heads, head_dim = query.shape
    kv_length, kv_heads = key.shape[1], key.shape[2]
    groups = heads // kv_heads
    scale = head_dim ** -0.5 if scale is None else scale
    # [batch, kv_heads, groups, q, k]: grouped queries share their key head without copying it
    q = query.reshape(batch, q_length, kv_heads, groups, head_dim)
    scores = jnp.einsum("bqhgd,bkhd->bhgqk", q, key, preferred_element_type=jnp.float32) * scale
    if logit_softcap is not None:
        scores = logit_softcap * jnp.tanh(scores / logit_softcap)
    mask = attention_mask(q_length, kv_length, batch=batch, causal=causal, segment_ids=segment_ids,
                          positions=positions, sliding_window=sliding_window)
    scores = jnp.where(mask[:, :, None], scores, _MASKED)
    weights = jax.nn.softmax(scores, axis=-1).astype(value.dtype)
    out = jnp.einsum("bhgqk,bkhd->bqhgd", weights, value)
    return out.reshape(batch, q_length, heads, head_dim)
