"""`attention`: multi-head attention with causal, packed-segment, sliding-window and soft-capped
masks, through one signature whatever runs it.

Every model fitjax ships (the GPT example, the imported GPT-2, Llama, Qwen, Mistral and Gemma
models) and the generation program call this one function, so a faster kernel reaches all of
them at once. `implementation="auto"` picks per platform (the choice lives in
`fitjax.step.xla_<platform>`); `"xla"` is the plain path: scores in float32, materialised as
[batch, heads, query length, key length], which every platform runs and every kernel is tested
against.
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp

__all__ = ["attention", "attention_mask"]

Implementation = Literal["auto", "xla", "pallas", "cudnn"]
IMPLEMENTATIONS = ("auto", "xla", "pallas", "cudnn")

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
        key, value: [batch, kv_length, kv_heads, head_dim]; `heads` a multiple of `kv_heads`
            (grouped-query attention: each key/value head serves `heads // kv_heads` query heads).
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
        implementation: "auto" (the platform's fastest for these arguments), "xla" (plain,
            every platform), "pallas" (the TPU kernel) or "cudnn" (the GPU kernel).

    Example:
        >>> import jax.numpy as jnp, fitjax as fj
        >>> q = k = v = jnp.ones((2, 8, 4, 16))
        >>> packed = jnp.array([[1, 1, 1, 2, 2, 2, 2, 0]] * 2)   # two documents and a pad
        >>> fj.nn.attention(q, k, v, segment_ids=packed).shape
        (2, 8, 4, 16)
    """
    _check(query, key, value, implementation)
    return _plain(query, key, value, causal=causal, segment_ids=segment_ids, positions=positions,
                  sliding_window=sliding_window, logit_softcap=logit_softcap, scale=scale)


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
