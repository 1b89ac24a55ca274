"""`fj.nn.attention` through JAX's Pallas TPU "splash" attention kernel.

The kernel takes one example's [heads, length, head_dim] (fitjax's layout is [batch, length,
heads, head_dim]: transposed here, which XLA folds into the neighbouring matrix products) and is
vmapped over the batch. Its mask is static (causal, local window, or full, aligned as
`attention_mask` aligns them: the queries are the last positions of the keys'), the segment ids
are dynamic, and it has no `scale` argument: the queries are scaled before it, rounded once to
their dtype. Where the platform is not a TPU the same kernel runs in Pallas' interpreter (slow:
for tests on CPU). The kernel's residuals are named `RESIDUALS`, so a remat policy can keep them
(`jax.checkpoint_policies.save_only_these_names(RESIDUALS)`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from fitjax.step.xla_tpu import SplashBlocks

__all__ = ["RESIDUALS", "splash_attention"]

RESIDUALS = "fitjax_attention"


@functools.lru_cache(maxsize=64)
def _kernel(heads: int, q_length: int, kv_length: int, causal: bool, sliding_window: int | None,
            logit_softcap: float | None, blocks: SplashBlocks, interpret: bool):
    # built once per shape and mask: the mask's block map is computed in numpy at construction
    from jax.experimental.pallas.ops.tpu import splash_attention as splash

    shape, offset = (q_length, kv_length), kv_length - q_length
    if sliding_window is not None:  # keys above `position - window`, and (causal) none after it
        mask = splash.LocalMask(shape, window_size=(sliding_window - 1, 0 if causal else None), offset=offset)
    elif causal:
        mask = splash.CausalMask(shape, offset=offset)
    else:
        mask = splash.FullMask(shape)
    fused = blocks.fused_backward
    sizes = splash.BlockSizes(
        block_q=blocks.q, block_kv=blocks.kv, block_kv_compute=blocks.kv,
        block_q_dkv=blocks.q, block_kv_dkv=blocks.kv, block_kv_dkv_compute=blocks.kv,
        block_q_dq=None if fused else blocks.q, block_kv_dq=None if fused else blocks.kv,
        use_fused_bwd_kernel=fused)
    # concrete arrays, not values of the program being traced: the kernel outlives that trace
    with jax.ensure_compile_time_eval():
        return splash.make_splash_mha(splash.MultiHeadMask([mask] * heads), block_sizes=sizes, head_shards=1,
                                      q_seq_shards=1, attn_logits_soft_cap=logit_softcap,
                                      residual_checkpoint_name=RESIDUALS, interpret=interpret)


def splash_attention(query: jax.Array, key: jax.Array, value: jax.Array, *, causal: bool,
                     segment_ids: jax.Array | None, sliding_window: int | None, logit_softcap: float | None,
                     scale: float | None, blocks: SplashBlocks, interpret: bool) -> jax.Array:
    """`fj.nn.attention` for the kernel's cases (`segment_ids` one array for queries and keys;
    grouped-query heads as they come: the kernel maps each query head to its key head)."""
    from jax.experimental.pallas.ops.tpu.splash_attention import SegmentIds

    batch, q_length, heads, head_dim = query.shape
    kernel = _kernel(heads, q_length, key.shape[1], causal, sliding_window, logit_softcap, blocks, interpret)
    scale = head_dim ** -0.5 if scale is None else scale
    q = (query.astype(jnp.float32) * scale).astype(query.dtype).swapaxes(1, 2)
    k, v = key.swapaxes(1, 2), value.swapaxes(1, 2)
    if segment_ids is None:
        out = jax.vmap(kernel)(q, k, v)
    else:
        ids = segment_ids.astype(jnp.int32)
        out = jax.vmap(lambda q, k, v, ids: kernel(q, k, v, segment_ids=SegmentIds(ids, ids)))(q, k, v, ids)
    return out.swapaxes(1, 2)
