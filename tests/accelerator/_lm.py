"""A one-block language model for the accelerator tests: `fj.nn.attention` at the smallest
shapes the TPU kernel takes (128 positions, head_dim 64), with rows a model learns in a few
steps (each token the previous one plus one)."""

from __future__ import annotations

import flax.linen as nn
import jax
import numpy as np
import optax

import fitjax as fj

VOCAB, WIDTH, LENGTH = 64, 64, 128  # one head of 64

class TinyLM(nn.Module):
    attention: str = "auto"  # "xla" for a program traced for the CPU on a TPU host

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        embed = nn.Embed(VOCAB, WIDTH, embedding_init=nn.initializers.normal(0.05))
        x = embed(tokens)
        batch, length = tokens.shape
        q, k, v = (nn.Dense(WIDTH, use_bias=False, name=name)(x).reshape(batch, length, 1, WIDTH) for name in "qkv")
        attended = fj.nn.attention(q, k, v, causal=True, implementation=self.attention)
        x = nn.LayerNorm()(x + nn.Dense(WIDTH, use_bias=False, name="proj")(attended.reshape(batch, length, WIDTH)))
        return embed.attend(x)

class LM(fj.LitModule):
    def __init__(self, attention: str = "auto"):
        super().__init__()
        self.model = TinyLM(attention)

    def loss(self, model, batch):
        logits = model(batch["tokens"][:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["tokens"][:, 1:]).mean(), {"logits": logits}

    def metrics(self, batch, outputs):
        return {"acc": (outputs["logits"].argmax(-1) == batch["tokens"][:, 1:]).mean()}

    def predict_step(self, model, batch):
        return model(batch["tokens"][:, :-1])

    def configure_optimizer(self):
        return optax.adam(1e-2)

def rows(n: int = 32, seed: int = 0) -> dict[str, np.ndarray]:
    starts = np.random.default_rng(seed).integers(0, VOCAB, (n, 1))
    return {"tokens": ((starts + np.arange(LENGTH + 1)) % VOCAB).astype(np.int32)}

def host(tree):
    return jax.tree.map(np.asarray, jax.device_get(tree))

def device_of(tree) -> set:
    return {d for leaf in jax.tree.leaves(tree) for d in leaf.devices()}
