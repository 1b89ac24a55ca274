"""The decoder's parts, named as Hugging Face names them (`self_attn.q_proj`, `mlp.c_fc`, ...), so
the name map to a `transformers` checkpoint is a renaming of separators and leaves.

Every parameter carries logical axis names (`nn.with_logical_partitioning`) and the residual
stream, queries, keys, values and the MLP's hidden units are placed by them
(`nn.with_logical_constraint`, a no-op unless traced under rules); `LOGICAL_RULES` maps the names
to the mesh axes of `fj.strategies.FSDP`, which uses them for any `CausalLMModule` without user
code.

All attention goes through `fitjax.nn.attention`: causal, segment ids for packed rows and
padding, the (query, key) positions pair when a KV cache holds the keys, the sliding window, the
logit soft-cap and the scale of the layer, and the implementation the config names.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from fitjax.models._config import ModelConfig
from fitjax.nn import attention

__all__ = ["LOGICAL_RULES", "Block", "Chunk", "Head", "LayerCache", "RMSNorm", "activation", "layer_norm", "rotary"]

class LogicalRules(dict):
    """Logical axis names of `fitjax.models`' parameters and activations mapped to the mesh axes
    of `fj.strategies.FSDP` (`("data", "fsdp", "tensor")`), the `LOGICAL_RULES` every
    `CausalLMModule` declares.

    "embed" (the residual width) is sharded over `fsdp` (ZeRO-3); query heads, key/value heads
    and the MLP's hidden units over `tensor` (Megatron: the first matmul of each pair split by
    columns, the second by rows, one all-reduce per pair); the vocabulary, norms, a head's width,
    GPT-2's fused `c_attn` columns and the learned positions stay whole. "batch" is an
    activation's batch dimension, split over both data-parallel axes as the trainer splits each
    batch; "length" its positions; "layers" the leading axis of `scan_layers`' stacked parameters
    (every device keeps every layer's slice). An activation's "embed" resolves to no mesh axis
    (`fsdp` is the batch's already). Rules given to `FSDP(rules=...)` win over these, name by name.

    Example:
        >>> from fitjax.models import LOGICAL_RULES
        >>> LOGICAL_RULES["heads"], LOGICAL_RULES["embed"]
        ('tensor', 'fsdp')
    """


LOGICAL_RULES = LogicalRules({
    "batch": ("data", "fsdp"), "length": None, "embed": "fsdp", "vocab": None, "heads": "tensor",
    "kv_heads": "tensor", "head_dim": None, "mlp": "tensor", "qkv": None, "norm": None, "position": None,
    "layers": None,
})


def place(x: jax.Array, *names: str | None) -> jax.Array:
    """`x` laid out by logical names (a no-op unless traced under rules: `fj.strategies.FSDP`)."""
    return nn.with_logical_constraint(x, names)


def _init(config: ModelConfig, names: tuple, default: Any, *, residual: bool = False) -> Any:
    if config.init_std is None:
        init = default
    else:
        std = config.init_std
        if residual and config.scale_residual_init:
            std = std / (2 * config.num_layers) ** 0.5
        elif names[0] == "position" and config.position_init_std is not None:
            std = config.position_init_std
        init = nn.initializers.normal(std)
    return nn.with_logical_partitioning(init, names)


def dense(config: ModelConfig, features: int, names: tuple[str, str], name: str, *, bias: bool,
          residual: bool = False) -> nn.Dense:
    """A Dense layer whose kernel [in, out] is named `names` (its bias by the output's name)."""
    return nn.Dense(features, use_bias=bias, name=name,
                    kernel_init=_init(config, names, nn.initializers.lecun_normal(), residual=residual),
                    bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), names[1:]))


def embedding(config: ModelConfig, rows: int, names: tuple[str, str], name: str) -> nn.Embed:
    return nn.Embed(rows, config.hidden_size, name=name,
                    embedding_init=_init(config, names, nn.linear.default_embed_init))


LayerCache = tuple[jax.Array, jax.Array]  # every layer's keys and values [layers, batch, max_length, kv_heads, head_dim]


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
    axis_name: str = "norm"

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        init = nn.initializers.zeros if self.plus_one else nn.initializers.ones
        scale = self.param("scale", nn.with_logical_partitioning(init, (self.axis_name,)), (x.shape[-1],))
        y = x.astype(jnp.float32)
        y = y * jax.lax.rsqrt(jnp.mean(y * y, axis=-1, keepdims=True) + self.eps)
        if self.plus_one:  # Gemma multiplies in float32, then casts
            return (y * (1.0 + scale.astype(jnp.float32))).astype(x.dtype)
        return scale * y.astype(x.dtype)  # Llama casts, then multiplies


def layer_norm(config: ModelConfig, name: str) -> nn.LayerNorm:
    named = lambda init: nn.with_logical_partitioning(init, ("norm",))  # noqa: E731
    return nn.LayerNorm(config.norm_eps, use_bias=config.norm_bias, name=name,
                        scale_init=named(nn.initializers.ones_init()), bias_init=named(nn.initializers.zeros_init()))


def norm(config: ModelConfig, name: str) -> nn.Module:
    if config.norm == "layer":
        return layer_norm(config, name)
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
    """Self-attention of one layer; with `cache` (every layer's keys and values, stacked), this
    chunk's keys and values are written into layer `index`'s slots from `chunk.index` on and the
    queries attend over that layer's whole cache."""

    config: ModelConfig
    layer: int

    @nn.compact
    def __call__(self, x: jax.Array, chunk: Chunk, cache: LayerCache | None, index: Any):
        c = self.config
        heads = lambda t, n: t.reshape(*t.shape[:2], n, c.head_dim)  # noqa: E731
        if c.gpt2_layout and c.fused_qkv:  # GPT-2's fused c_attn: its columns are q, k, v (not split by heads)
            fused = dense(c, 3 * c.num_heads * c.head_dim, ("embed", "qkv"), "c_attn", bias=c.qkv_bias)(x)
            q, k, v = (heads(t, c.num_heads) for t in jnp.split(fused, 3, axis=-1))
        else:  # separate projections; kernels [hidden, heads x head_dim]: 2-D, as the checkpoints hold them
            project = lambda n, axis, name: heads(  # noqa: E731
                dense(c, n * c.head_dim, ("embed", axis), name, bias=c.qkv_bias)(x), n)
            q = project(c.num_heads, "heads", "q_proj")
            k = project(c.num_kv_heads, "kv_heads", "k_proj")
            v = project(c.num_kv_heads, "kv_heads", "v_proj")
        q = place(q, "batch", "length", "heads", "head_dim")
        k, v = (place(t, "batch", "length", "kv_heads", "head_dim") for t in (k, v))
        if c.qk_norm:
            q = RMSNorm(c.norm_eps, plus_one=c.norm == "rms_plus_one", axis_name="head_dim", name="q_norm")(q)
            k = RMSNorm(c.norm_eps, plus_one=c.norm == "rms_plus_one", axis_name="head_dim", name="k_norm")(k)
        rope = c.rope_for(self.layer)
        if rope is not None:
            inverse = rope.inverse_frequencies(c.head_dim)
            q, k = rotary(q, chunk.positions, inverse), rotary(k, chunk.positions, inverse)
        implementation = c.attention
        if cache is not None:  # written in place: one slot range of one layer (a loop carry XLA updates)
            start = (index, 0, chunk.index, 0, 0)
            cache = tuple(jax.lax.dynamic_update_slice(stack, new[None].astype(stack.dtype), start)
                          for stack, new in zip(cache, (k, v)))
            k, v = (jax.lax.dynamic_index_in_dim(stack, index, keepdims=False).astype(q.dtype) for stack in cache)
            implementation = "auto"  # a chunk against a longer buffer: the platform's choice
        out = attention(q, k, v, causal=True, sliding_window=c.window_for(self.layer),
                        logit_softcap=c.attn_softcap, scale=c.attention_scale, implementation=implementation,
                        **chunk.mask)
        out = out.reshape(*out.shape[:2], -1)
        name = "c_proj" if c.gpt2_layout else "o_proj"
        return dense(c, c.hidden_size, ("heads", "embed"), name, bias=c.out_bias, residual=True)(out), cache


class MLP(nn.Module):
    config: ModelConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        c = self.config
        act = activation(c.activation)
        if c.gpt2_layout:
            h = place(dense(c, c.intermediate_size, ("embed", "mlp"), "c_fc", bias=c.mlp_bias)(x),
                      "batch", "length", "mlp")
            return dense(c, c.hidden_size, ("mlp", "embed"), "c_proj", bias=c.mlp_bias, residual=True)(act(h))
        up = lambda name: dense(c, c.intermediate_size, ("embed", "mlp"), name, bias=c.mlp_bias)(x)  # noqa: E731
        hidden = place(act(up("gate_proj")) * up("up_proj"), "batch", "length", "mlp")
        return dense(c, c.hidden_size, ("mlp", "embed"), "down_proj", bias=c.mlp_bias, residual=True)(hidden)


class Block(nn.Module):
    """One decoder layer: pre-norm attention and MLP, each added to the residual stream; Gemma
    also normalises each branch's output (`sandwich_norm`).

    Called as `nn.scan`'s body is: `((x, cache), chunk, index) -> ((x, cache), None)`, with
    `cache` every layer's keys and values (or None) and `index` this layer's place in it (an int
    when unrolled, traced under `scan_layers`)."""

    config: ModelConfig
    layer: int

    @nn.compact
    def __call__(self, carry: tuple[jax.Array, LayerCache | None], chunk: Chunk, index: Any):
        x, cache = carry
        c = self.config
        names = (("ln_1", "attn", "ln_2") if c.gpt2_layout else
                 ("input_layernorm", "self_attn", "pre_feedforward_layernorm" if c.sandwich_norm
                  else "post_attention_layernorm"))
        h, cache = Attention(c, self.layer, name=names[1])(norm(c, names[0])(x), chunk, cache, index)
        if c.sandwich_norm:
            h = norm(c, "post_attention_layernorm")(h)
        x = place(x + h, "batch", "length", "embed")
        h = MLP(c, name="mlp")(norm(c, names[2])(x))
        if c.sandwich_norm:
            h = norm(c, "post_feedforward_layernorm")(h)
        return (place(x + h, "batch", "length", "embed"), cache), None


class Head(nn.Module):
    """An untied output layer's kernel [hidden, vocab] (`lm_head.kernel`), returned whole: the
    logits are `x @ kernel`, and the chunked loss takes it without making them."""

    config: ModelConfig

    @nn.compact
    def __call__(self) -> jax.Array:
        c = self.config
        return self.param("kernel", _init(c, ("embed", "vocab"), nn.initializers.lecun_normal()),
                          (c.hidden_size, c.vocab_size))
