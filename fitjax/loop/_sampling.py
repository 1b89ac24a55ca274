"""The next token from a row of logits: greedy, or drawn at a temperature from the top-k tokens
and the top-p probability mass (Hugging Face's order: temperature, then top-k, then top-p).

Every option is a traced value, so one compiled generation program serves greedy decoding and
any sampling settings; greedy skips the sort (a `lax.cond` on the temperature).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["next_tokens"]


def next_tokens(logits: jax.Array, key: jax.Array, temperature: jax.Array, top_k: jax.Array,
                top_p: jax.Array) -> jax.Array:
    """int32 [batch] from float32 logits [batch, vocab].

    `temperature <= 0`: the argmax. Else a draw from `softmax(logits / temperature)` restricted
    to the `top_k` most likely tokens (0: all) and then to the smallest set of most likely tokens
    whose probability reaches `top_p` (1.0: all); ties at a cut stay in.
    """

    def greedy(logits):
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)

    def draw(logits):
        logits = logits / temperature
        vocab = logits.shape[-1]
        ranked = jnp.sort(logits, axis=-1)[:, ::-1]  # [batch, vocab], most likely first
        k = jnp.where(top_k > 0, jnp.minimum(top_k, vocab), vocab)
        in_top_k = jnp.arange(vocab) < k
        probs = jax.nn.softmax(jnp.where(in_top_k, ranked, -jnp.inf), axis=-1)
        mass_before = jnp.cumsum(probs, axis=-1) - probs
        kept = jnp.sum(in_top_k & (mass_before < top_p), axis=-1, keepdims=True)  # >= 1: the first's is 0
        cutoff = jnp.take_along_axis(ranked, jnp.maximum(kept, 1) - 1, axis=-1)
        logits = jnp.where(logits >= cutoff, logits, -jnp.inf)
        return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)

    return jax.lax.cond(temperature > 0, draw, greedy, logits)
