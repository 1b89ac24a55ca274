"""The decoder's parts, named as Hugging Face names them (`self_attn.q_proj`, `mlp.c_fc`, ...), so
the name map to a `transformers` checkpoint is a renaming of separators and leaves.

All attention goes through `fitjax.nn.attention`: causal, segment ids for packed rows and
padding, the (query, key) positions pair when a KV cache holds the keys, the sliding window, the
logit soft-cap and the scale of the layer.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from fitjax.models._config import ModelConfig
from fitjax.nn import attention

__all__ = ["Block", "Chunk", "LayerCache", "RMSNorm", "activation", "rotary"]

LayerCache = tuple[jax.Array, jax.Array]  # one layer's keys and values [batch, max_length, kv_heads, head_dim]


class Chunk(NamedTuple):
    """Where the tokens of a call sit, the same for every layer: their positions [batch, length],
    `fitjax.nn.attention`'s mask arguments, and (with a cache) the slot they are written at."""

    positions: jax.Array
    mask: dict[str, Any]
    index: jax.Array


def activation(name: str):
    """`transformers`' activation of that name (`gelu_new` and `gelu_pytorch_tanh` are the tanh
    approximation)."""
    return {"silu": nn.silu, "relu": nn.relu, "gelu": lambda x: nn.gelu(x, approximate=False),
            "gelu_new": lambda x: nn.gelu(x, approximate=True),
            "gelu_pytorch_tanh": lambda x: nn.gelu(x, approximate=True)}[name]


class RMSNorm(nn.Module):
    """x / rms(x) (in float32) times a learned scale; Gemma's (`plus_one`) times (1 + scale),
    its scale starting at 0."""

    eps: float
    plus_one: bool = False

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        init = nn.initializers.zeros if self.plus_one else nn.initializers.ones
        scale = self.param("scale", init, (x.shape[-1],))
        y = x.astype(jnp.float32)
        y = y * jax.lax.rsqrt(jnp.mean(y * y, axis=-1, keepdims=True) + self.eps)
        if self.plus_one:  # Gemma multiplies in float32, then casts
            return (y * (1.0 + scale.astype(jnp.float32))).astype(x.dtype)
        return scale * y.astype(x.dtype)  # Llama casts, then multiplies


def norm(config: ModelConfig, name: str) -> nn.Module:
    if config.norm == "layer":
        return nn.LayerNorm(config.norm_eps, name=name)
    return RMSNorm(config.norm_eps, plus_one=config.norm == "rms_plus_one", name=name)


def rotary(x: jax.Array, positions: jax.Array, inverse_frequencies: Any) -> jax.Array:
    """Rotary positions on [batch, length, heads, head_dim] at `positions` [batch, length],
    Hugging Face's layout (each head's two halves rotated together)."""
    angles = positions[..., None].astype(jnp.float32) * jnp.asarray(inverse_frequencies)  # [b, l, d/2]
    angles = jnp.concatenate([angles, angles], -1)[:, :, None, :]
    cos, sin = jnp.cos(angles).astype(x.dtype), jnp.sin(angles).astype(x.dtype)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], -1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    """Self-attention of one layer; with `cache`, this chunk's keys and values are written at
    slot `index` and the queries attend over the whole cache."""

    config: ModelConfig
    layer: int

    @nn.compact
    def __call__(self, x: jax.Array, chunk: Chunk, cache: LayerCache | None = None):
        c = self.config
        heads = lambda t, n: t.reshape(*t.shape[:2], n, c.head_dim)  # noqa: E731
        if not c.gpt2_layout:  # separate projections
            dense = lambda n, name: nn.Dense(n * c.head_dim, use_bias=c.qkv_bias, name=name)(x)  # noqa: E731
            q = heads(dense(c.num_heads, "q_proj"), c.num_heads)
            k = heads(dense(c.num_kv_heads, "k_proj"), c.num_kv_heads)
            v = heads(dense(c.num_kv_heads, "v_proj"), c.num_kv_heads)
        else:  # GPT-2's fused c_attn
            q, k, v = (heads(t, c.num_heads) for t in
                       jnp.split(nn.Dense(3 * c.num_heads * c.head_dim, name="c_attn")(x), 3, axis=-1))
        if c.qk_norm:
            q = RMSNorm(c.norm_eps, plus_one=c.norm == "rms_plus_one", name="q_norm")(q)
            k = RMSNorm(c.norm_eps, plus_one=c.norm == "rms_plus_one", name="k_norm")(k)
        rope = c.rope_for(self.layer)
        if rope is not None:
            inverse = rope.inverse_frequencies(c.head_dim)
            q, k = rotary(q, chunk.positions, inverse), rotary(k, chunk.positions, inverse)
        if cache is not None:
            start = (0, chunk.index, 0, 0)
            cache = tuple(jax.lax.dynamic_update_slice(buffer, new.astype(buffer.dtype), start)
                          for buffer, new in zip(cache, (k, v)))
            k, v = (buffer.astype(q.dtype) for buffer in cache)
        out = attention(q, k, v, causal=True, sliding_window=c.window_for(self.layer),
                        logit_softcap=c.attn_softcap, scale=c.attention_scale, **chunk.mask)
        out = out.reshape(*out.shape[:2], -1)
        if not c.gpt2_layout:
            return nn.Dense(c.hidden_size, use_bias=c.out_bias, name="o_proj")(out), cache
        return nn.Dense(c.hidden_size, name="c_proj")(out), cache


class MLP(nn.Module):
    config: ModelConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        c = self.config
        act = activation(c.activation)
        if c.gpt2_layout:
            return nn.Dense(c.hidden_size, name="c_proj")(act(nn.Dense(c.intermediate_size, name="c_fc")(x)))
        dense = lambda n, name, h: nn.Dense(n, use_bias=c.mlp_bias, name=name)(h)  # noqa: E731
        hidden = act(dense(c.intermediate_size, "gate_proj", x)) * dense(c.intermediate_size, "up_proj", x)
        return dense(c.hidden_size, "down_proj", hidden)


class Block(nn.Module):
    """One decoder layer: pre-norm attention and MLP, each added to the residual stream; Gemma
    also normalises each branch's output (`sandwich_norm`)."""

    config: ModelConfig
    layer: int

    @nn.compact
    def __call__(self, x: jax.Array, chunk: Chunk, cache: LayerCache | None = None):
        c = self.config
        names = (("ln_1", "attn", "ln_2") if c.gpt2_layout else
                 ("input_layernorm", "self_attn", "pre_feedforward_layernorm" if c.sandwich_norm
                  else "post_attention_layernorm"))
        h, cache = Attention(c, self.layer, name=names[1])(norm(c, names[0])(x), chunk, cache)
        if c.sandwich_norm:
            h = norm(c, "post_attention_layernorm")(h)
        x = x + h
        h = MLP(c, name="mlp")(norm(c, names[2])(x))
        if c.sandwich_norm:
            h = norm(c, "post_feedforward_layernorm")(h)
        return x + h, cache
