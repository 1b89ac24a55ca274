"""GPT-2 and Llama in Flax Linen, reading and writing Hugging Face's format (`config.json` and
`model.safetensors`), so a model `transformers` saved fine-tunes under fitjax and goes back.

    module = hf_models.from_pretrained("path/to/gpt2")      # a folder `save_pretrained` wrote
    fj.Trainer(max_steps=100, strategy="fsdp").fit(module, data)
    hf_models.save_pretrained(module, "out/")               # AutoModelForCausalLM.from_pretrained("out/")

The two models share everything but their blocks: the attention (causal, grouped key/value
heads), the causal LM `LitModule` (next-token cross-entropy on `batch["tokens"]`) and the name
rules. The layers are named as Hugging Face names them (`h_0.attn.c_attn` for `h.0.attn.c_attn`,
`layers_0.self_attn.q_proj`), so the mapping between the two is a handful of regexes:

- GPT-2: learned positions, LayerNorm with bias, fused `c_attn` and GELU (tanh) MLP; its `Conv1D`
  weights are already `[in, out]` (nothing transposed); the output head is the token table.
- Llama: rotary positions (`rope_theta`), RMSNorm, SwiGLU MLP, grouped key/value heads
  (`num_key_value_heads`); its `nn.Linear` weights are `[out, in]` (transposed both ways); the
  head is `lm_head` unless `tie_word_embeddings`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

import fitjax as fj


@dataclasses.dataclass(frozen=True)
class LMConfig:
    """The architecture, from (and back to) a Hugging Face `config.json`."""

    arch: str  # "gpt2" | "llama"
    vocab: int
    width: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    mlp: int
    context: int
    eps: float
    rope_theta: float = 10000.0
    tie: bool = True

    @classmethod
    def from_hf(cls, config: dict[str, Any]) -> "LMConfig":
        kind = config.get("model_type")
        if kind == "gpt2":
            width = config["n_embd"]
            return cls("gpt2", config["vocab_size"], width, config["n_layer"], config["n_head"], config["n_head"],
                       width // config["n_head"], config.get("n_inner") or 4 * width, config["n_positions"],
                       config["layer_norm_epsilon"], tie=True)
        if kind == "llama":
            heads, width = config["num_attention_heads"], config["hidden_size"]
            rope = config.get("rope_parameters") or {}
            if rope.get("rope_type", "default") != "default" or config.get("attention_bias") or config.get("mlp_bias"):
                raise ValueError(f"hf_models reads plain Llama configs (default rotary, no biases); got {config!r}")
            return cls("llama", config["vocab_size"], width, config["num_hidden_layers"], heads,
                       config.get("num_key_value_heads") or heads, config.get("head_dim") or width // heads,
                       config["intermediate_size"], config["max_position_embeddings"], config["rms_norm_eps"],
                       rope_theta=rope.get("rope_theta", config.get("rope_theta", 10000.0)),
                       tie=config.get("tie_word_embeddings", False))
        raise ValueError(f"config.json has model_type={kind!r}; hf_models reads 'gpt2' and 'llama'.")

    def to_hf(self) -> dict[str, Any]:
        """The keys `transformers` needs to rebuild the model (merged over the imported file's)."""
        if self.arch == "gpt2":
            return {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": self.vocab,
                    "n_embd": self.width, "n_layer": self.layers, "n_head": self.heads, "n_inner": self.mlp,
                    "n_positions": self.context, "layer_norm_epsilon": self.eps, "activation_function": "gelu_new",
                    "tie_word_embeddings": True}
        return {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": self.vocab,
                "hidden_size": self.width, "num_hidden_layers": self.layers, "num_attention_heads": self.heads,
                "num_key_value_heads": self.kv_heads, "head_dim": self.head_dim, "intermediate_size": self.mlp,
                "max_position_embeddings": self.context, "rms_norm_eps": self.eps, "hidden_act": "silu",
                "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
                "tie_word_embeddings": self.tie, "attention_bias": False, "mlp_bias": False}


# ------------------------------------------------------------------------------ shared layers

def causal_attention(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """`[batch, length, heads, head_dim]` queries over `kv_heads` keys and values (grouped when
    fewer), scaled by 1/sqrt(head_dim), softmax in float32; -> `[batch, length, heads * head_dim]`."""
    groups = q.shape[2] // k.shape[2]
    k, v = (jnp.repeat(t, groups, axis=2) for t in (k, v))
    out = jax.nn.dot_product_attention(q, k, v, is_causal=True)
    return out.reshape(*out.shape[:2], -1)


def _heads(x: jax.Array, n: int) -> jax.Array:
    return x.reshape(*x.shape[:2], n, -1)


class GPT2Attention(nn.Module):
    config: LMConfig

    @nn.compact
    def __call__(self, x):
        c = self.config
        q, k, v = jnp.split(nn.Dense(3 * c.width, name="c_attn")(x), 3, axis=-1)
        return nn.Dense(c.width, name="c_proj")(causal_attention(_heads(q, c.heads), _heads(k, c.heads),
                                                                 _heads(v, c.heads)))


class GPT2MLP(nn.Module):
    config: LMConfig

    @nn.compact
    def __call__(self, x):
        h = nn.gelu(nn.Dense(self.config.mlp, name="c_fc")(x), approximate=True)  # HF's "gelu_new"
        return nn.Dense(self.config.width, name="c_proj")(h)


class GPT2Block(nn.Module):
    config: LMConfig

    @nn.compact
    def __call__(self, x):
        eps = self.config.eps
        x = x + GPT2Attention(self.config, name="attn")(nn.LayerNorm(eps, name="ln_1")(x))
        return x + GPT2MLP(self.config, name="mlp")(nn.LayerNorm(eps, name="ln_2")(x))


class RMSNorm(nn.Module):
    """Llama's norm: x / rms(x) (in float32) times a learned scale."""

    eps: float

    @nn.compact
    def __call__(self, x):
        scale = self.param("scale", nn.initializers.ones, (x.shape[-1],))
        y = x.astype(jnp.float32)
        y = y * jax.lax.rsqrt(jnp.mean(y * y, axis=-1, keepdims=True) + self.eps)
        return scale * y.astype(x.dtype)


def rotary(x: jax.Array, theta: float) -> jax.Array:
    """Rotary positions on `[batch, length, heads, head_dim]`, Hugging Face's layout (the two
    halves of each head rotated together, not interleaved pairs)."""
    half = x.shape[-1] // 2
    freqs = 1.0 / theta ** (jnp.arange(0, half, dtype=jnp.float32) / half)
    angles = jnp.arange(x.shape[1], dtype=jnp.float32)[:, None] * freqs  # [length, half]
    cos, sin = (jnp.concatenate([f(angles)] * 2, -1)[None, :, None, :] for f in (jnp.cos, jnp.sin))
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], -1)
    return (x * cos + rotated * sin).astype(x.dtype)


class LlamaAttention(nn.Module):
    config: LMConfig

    @nn.compact
    def __call__(self, x):
        c = self.config
        dense = lambda n, name: nn.Dense(n * c.head_dim, use_bias=False, name=name)(x)  # noqa: E731
        q = rotary(_heads(dense(c.heads, "q_proj"), c.heads), c.rope_theta)
        k = rotary(_heads(dense(c.kv_heads, "k_proj"), c.kv_heads), c.rope_theta)
        v = _heads(dense(c.kv_heads, "v_proj"), c.kv_heads)
        return nn.Dense(c.width, use_bias=False, name="o_proj")(causal_attention(q, k, v))


class LlamaMLP(nn.Module):
    config: LMConfig

    @nn.compact
    def __call__(self, x):
        c = self.config
        gate = nn.Dense(c.mlp, use_bias=False, name="gate_proj")(x)
        up = nn.Dense(c.mlp, use_bias=False, name="up_proj")(x)
        return nn.Dense(c.width, use_bias=False, name="down_proj")(nn.silu(gate) * up)


class LlamaBlock(nn.Module):
    config: LMConfig

    @nn.compact
    def __call__(self, x):
        c = self.config
        x = x + LlamaAttention(c, name="self_attn")(RMSNorm(c.eps, name="input_layernorm")(x))
        return x + LlamaMLP(c, name="mlp")(RMSNorm(c.eps, name="post_attention_layernorm")(x))


class CausalLM(nn.Module):
    """tokens `[batch, length]` -> logits `[batch, length, vocab]`, GPT-2 or Llama by `config.arch`."""

    config: LMConfig

    @nn.compact
    def __call__(self, tokens):
        c = self.config
        if c.arch == "gpt2":
            embed = nn.Embed(c.vocab, c.width, name="wte")
            x = embed(tokens) + nn.Embed(c.context, c.width, name="wpe")(jnp.arange(tokens.shape[1]))
            for i in range(c.layers):
                x = GPT2Block(c, name=f"h_{i}")(x)
            x = nn.LayerNorm(c.eps, name="ln_f")(x)
        else:
            embed = nn.Embed(c.vocab, c.width, name="embed_tokens")
            x = embed(tokens)
            for i in range(c.layers):
                x = LlamaBlock(c, name=f"layers_{i}")(x)
            x = RMSNorm(c.eps, name="norm")(x)
        return embed.attend(x) if c.tie else nn.Dense(c.vocab, use_bias=False, name="lm_head")(x)


class CausalLMModule(fj.LitModule):
    """Next-token prediction on `batch["tokens"]` `[batch, length + 1]` int32.

    Args:
        config: the Hugging Face `config.json` as a dict (GPT-2 or Llama).
        lr: AdamW's learning rate.
    """

    def __init__(self, config: dict[str, Any], lr: float = 1e-3):
        super().__init__()
        self.save_hyperparameters()
        self.model = CausalLM(LMConfig.from_hf(config))

    def loss(self, model, batch):
        tokens = batch["tokens"]
        logits = model(tokens[:, :-1]).astype(jnp.float32)
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

    def configure_optimizer(self):
        return optax.adamw(self.hparams.lr)


# ------------------------------------------------------------------------------------ names

# Hugging Face's name -> fitjax's, per architecture; `_HF_NAMES` reads them the other way.
_PREFIX = {"gpt2": "transformer.", "llama": "model."}
_NORMS = r"ln_\w+|\w*norm"
_EMBEDS = r"wte|wpe|embed_tokens"


def hf_to_fitjax(arch: str):
    """`{regex: replacement}` from a `transformers` checkpoint's names to `CausalLM`'s."""
    prefix = re.escape(_PREFIX[arch])
    return {
        rf"{prefix}h\.\d+\.attn\.(masked_)?bias": None,  # GPT-2's causal-mask buffers (older files)
        r"lm_head\.weight": "lm_head.kernel",  # dropped as unexpected-but-tied by the tie check below
        rf"{prefix}(.*?)\.(\d+)\.(.*)": r"\1_\2.\3",
        rf"{prefix}(.*)": r"\1",
    }


def _leaf_names(name: str) -> str:
    """`...ln_1.weight` -> `scale`, `wte.weight` -> `embedding`, other `.weight` -> `kernel`."""
    head, _, leaf = name.rpartition(".")
    if leaf != "weight":
        return name
    last = head.rpartition(".")[2]
    if re.fullmatch(_NORMS, last):
        return f"{head}.scale"
    return f"{head}.embedding" if re.fullmatch(_EMBEDS, last) else f"{head}.kernel"


def _transposed(arch: str) -> str:
    return r".*_proj\.kernel|lm_head\.kernel" if arch == "llama" else r"(?!)"  # GPT-2's Conv1D: [in, out]


def from_pretrained(folder: str | os.PathLike, **kwargs: Any) -> CausalLMModule:
    """A `CausalLMModule` holding the weights of a folder `save_pretrained` wrote (read when the
    trainer builds the state, into the strategy's shardings)."""
    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    module = CausalLMModule(config, **kwargs)
    arch, tie = module.model.config.arch, module.model.config.tie
    rules = hf_to_fitjax(arch)

    def rename(name: str) -> str | None:
        for pattern, replacement in rules.items():
            match = re.fullmatch(pattern, name)
            if match:
                if replacement is None or (tie and name == "lm_head.weight"):
                    return None  # a tied head is the token table itself
                return _leaf_names(match.expand(replacement))
        return name

    module.load_weights(folder, mapping=rename, transpose=_transposed(arch))
    return module


def save_pretrained(module: CausalLMModule, folder: str | os.PathLike) -> None:
    """Writes `config.json` and `model.safetensors` that `AutoModelForCausalLM.from_pretrained`
    loads: the trained weights under Hugging Face's names and layouts."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = module.model.config
    prefix = _PREFIX[config.arch]

    def rename(name: str) -> str:
        head, _, leaf = name.rpartition(".")
        leaf = "weight" if leaf in ("kernel", "scale", "embedding") else leaf
        head = re.sub(r"^(h|layers)_(\d+)", r"\1.\2", head)
        return f"{head}.{leaf}" if head == "lm_head" else f"{prefix}{head}.{leaf}"

    module.save_weights(folder / "model.safetensors", mapping=rename, transpose=_transposed(config.arch),
                        metadata={"format": "pt"})
    if jax.process_index() == 0:
        merged = {**module.hparams.config, **config.to_hf()}
        (folder / "config.json").write_text(json.dumps(merged, indent=2))
