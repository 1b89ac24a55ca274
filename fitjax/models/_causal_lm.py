"""`CausalLM`: tokens in, next-token logits out (or, with `targets`, the chunked cross-entropy
against them), for every family `ModelConfig` reads; with a `KVCache`, one chunk at a time (a
prompt, then a token per step) for generation.

The cache holds every layer's keys and values stacked, [layers, batch, max_length, kv_heads,
head_dim] (the one layout, unrolled layers and `scan_layers` alike: the scan carries it), and
per slot its segment id (0: empty or padding) and position. A call writes its chunk at the
cache's `index` (the same slots for every row: a batch of left-padded prompts stays aligned),
advances `index` by the chunk's length, and attends over the whole cache through
`fitjax.nn.attention` with the (query, key) positions and segment-id pairs: empty slots and
padding (segment 0) are never seen, and causality and sliding windows compare positions, not
slots. So a left-padded prompt may number its real tokens from 0 (as `transformers`' `generate`
does), whatever its padding.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from fitjax.models._config import ModelConfig
from fitjax.models._layers import Block, Chunk, Head, embedding, norm, place
from fitjax.nn import chunked_cross_entropy
from fitjax.step.layer_stack import run_layers

__all__ = ["CausalLM", "KVCache", "init_cache"]


class KVCache(NamedTuple):
    """The keys and values a `CausalLM` has seen, in the model's own layout (a pytree: jit,
    donate and shard it like any other; `index` a scalar).

    Attributes:
        keys, values: every layer's, stacked: [layers, batch, max_length, kv_heads, head_dim].
        segment_ids: int32 [batch, max_length]: each slot's segment id; 0 for a slot not written
            yet or holding padding.
        positions: int32 [batch, max_length]: each slot's position (what causality, sliding
            windows and rotary positions use).
        index: int32 scalar: the slot the next chunk is written at.
    """

    keys: jax.Array
    values: jax.Array
    segment_ids: jax.Array
    positions: jax.Array
    index: jax.Array

    @property
    def max_length(self) -> int:
        return self.segment_ids.shape[1]


def init_cache(config: ModelConfig, batch: int, max_length: int, dtype: Any = jnp.float32) -> KVCache:
    """An empty cache for `batch` rows of up to `max_length` tokens (prompt and generated)."""
    shape = (config.num_layers, batch, max_length, config.num_kv_heads, config.head_dim)
    slots = (batch, max_length)
    return KVCache(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype), jnp.zeros(slots, jnp.int32),
                   jnp.zeros(slots, jnp.int32), jnp.zeros((), jnp.int32))


def _one_layer(config: ModelConfig):
    """One layer of the scanned stack as a pure function of its parameters (one slice of the
    stacked ones), for `fitjax.step.layer_stack.run_layers`."""
    block = Block(config, 0)  # the scan's body: every layer is layer 0's module with its own slice

    def layer(layer_params, x, chunk, index):
        (y, _), _ = block.apply({"params": layer_params}, (x, None), chunk, index)
        return y

    return layer


class CausalLM(nn.Module):
    """A decoder-only language model of any family `ModelConfig` reads; its layers are named as
    in the Hugging Face checkpoint (`layers_0.self_attn.q_proj`, GPT-2's `h_0.attn.c_attn`; with
    `scan_layers`, one stacked `layers.self_attn.q_proj` [layers, ...]).

    Attributes:
        config: the architecture (`vocab_size`, `eos_token_id`, `max_position_embeddings`, ...)
            and fitjax's switches (`scan_layers`, `attention`).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from fitjax.models import from_config
        >>> model = from_config({"model_type": "llama", "vocab_size": 128, "hidden_size": 32,
        ...                      "intermediate_size": 64, "num_hidden_layers": 2,
        ...                      "num_attention_heads": 4, "num_key_value_heads": 2})
        >>> tokens = jnp.zeros((2, 8), jnp.int32)
        >>> params = model.init(jax.random.key(0), tokens)
        >>> model.apply(params, tokens).shape
        (2, 8, 128)
        >>> float(model.apply(params, tokens, targets=tokens).mean) > 0   # chunked: no [2, 8, 128] logits
        True
        >>> cache = model.init_cache(2, 16)                        # generation: prompt, then steps
        >>> logits, cache = model.apply(params, tokens, cache=cache)
        >>> logits, cache = model.apply(params, tokens[:, :1], cache=cache)
        >>> int(cache.index), cache.keys.shape
        (9, (2, 2, 16, 2, 8))
    """

    config: ModelConfig

    @property
    def max_positions(self) -> int | None:
        """The positions the model has: its learned table's size (GPT-2's layout); None with rotary
        positions, which have no table (past `max_position_embeddings` the quality is the
        model's own, as in `transformers`). `Trainer.generate` refuses prompts that run past it."""
        return self.config.max_position_embeddings if self.config.gpt2_layout else None

    def init_cache(self, batch: int, max_length: int, dtype: Any = jnp.float32) -> KVCache:
        """An empty `KVCache` (needs no parameters: callable on the unbound model)."""
        return init_cache(self.config, batch, max_length, dtype)

    @nn.compact
    def __call__(self, tokens: jax.Array, *, positions: jax.Array | None = None,
                 segment_ids: jax.Array | None = None, cache: KVCache | None = None,
                 targets: jax.Array | None = None, loss_mask: jax.Array | None = None, loss_chunk: int = 256):
        """Logits [batch, length, vocab] of `tokens` int [batch, length]; with `cache`,
        `(logits, new_cache)`; with `targets`, the `fj.TokenLoss` of predicting them.

        Args:
            tokens: int [batch, length].
            positions: int [batch, length], what rotary or learned positions and (with a cache)
                causality use; default `arange(length)`, continuing from the cache's `index`.
            segment_ids: int [batch, length]: packed documents never attend to each other, and
                id 0 marks padding (never attended to from another segment).
            cache: a `KVCache` (`init_cache`): this chunk is written at its `index` and the
                queries attend over every filled slot of their segment.
            targets: int [batch, length]: the output layer and its softmax cross-entropy are
                computed `loss_chunk` positions at a time (`fj.nn.chunked_cross_entropy`: never
                the whole float32 logits) and their `TokenLoss` returned (`.mean`, `.sum`).
            loss_mask: [batch, length] with `targets`: 1 where a target counts, 0 where not.
            loss_chunk: positions per chunk of the loss.
        """
        c = self.config
        batch, length = tokens.shape
        start = jnp.zeros((), jnp.int32) if cache is None else cache.index
        default_positions = positions is None
        if positions is None:
            positions = jnp.broadcast_to(start + jnp.arange(length, dtype=jnp.int32), (batch, length))
        positions = positions.astype(jnp.int32)
        if c.gpt2_layout:
            embed = embedding(c, c.vocab_size, ("vocab", "embed"), "wte")
            table = embedding(c, c.max_position_embeddings, ("position", "embed"), "wpe")
            if default_positions and cache is None:  # a slice of the table (its gradient a slice too)
                where = table.embedding[:length][None].astype(embed.embedding.dtype)
            else:
                # clipped: a padding token's position may be anything, and an index outside the
                # table reads NaN, which would reach every query through the masked (zero-weight) values
                where = table(jnp.clip(positions, 0, c.max_position_embeddings - 1))
            x = embed(tokens) + where
        else:
            embed = embedding(c, c.vocab_size, ("vocab", "embed"), "embed_tokens")
            x = embed(tokens)
            if c.embed_scale is not None:
                x = x * jnp.asarray(c.embed_scale, x.dtype)
        x = place(x, "batch", "length", "embed")
        if cache is None:
            # column order is causal order: a fused kernel's fast path (no positions needed)
            mask: dict[str, Any] = {"segment_ids": segment_ids}
            stacked = None
        else:
            ids = jnp.ones((batch, length), jnp.int32) if segment_ids is None else segment_ids.astype(jnp.int32)
            kv_ids = jax.lax.dynamic_update_slice(cache.segment_ids, ids, (0, start))
            kv_positions = jax.lax.dynamic_update_slice(cache.positions, positions, (0, start))
            mask = {"segment_ids": (ids, kv_ids), "positions": (positions, kv_positions)}
            stacked = (cache.keys, cache.values)
        chunk = Chunk(positions, mask, start)
        prefix = "h" if c.gpt2_layout else "layers"
        if c.scan_layers:  # one layer compiled, its parameters stacked on a leading "layers" axis
            layers = nn.scan(Block, variable_axes={"params": 0}, split_rngs={"params": True},
                             in_axes=(nn.broadcast, 0), length=c.num_layers,
                             metadata_params={nn.PARTITION_NAME: "layers"})
            stack = layers(c, 0, name=prefix)
            if cache is None:  # `Trainer(update_in_backward=True)` may run the layers one at a time
                x = run_layers(prefix, x, chunk, layer=_one_layer(c), num_layers=c.num_layers,
                               scan=lambda x: stack((x, None), chunk, jnp.arange(c.num_layers))[0][0])
            else:
                (x, stacked), _ = stack((x, stacked), chunk, jnp.arange(c.num_layers))
        else:
            for i in range(c.num_layers):
                (x, stacked), _ = Block(c, i, name=f"{prefix}_{i}")((x, stacked), chunk, i)
        x = norm(c, "ln_f" if c.gpt2_layout else "norm")(x)
        if targets is not None:  # the output layer as [vocab, hidden]: XLA folds an untied kernel's `.T`
            out = embed.embedding if c.tie_word_embeddings else Head(c, name="lm_head")().T
            return chunked_cross_entropy(x, out, targets, mask=loss_mask, chunk_size=loss_chunk,
                                         logit_softcap=c.final_softcap)
        logits = embed.attend(x) if c.tie_word_embeddings else x @ Head(c, name="lm_head")().astype(x.dtype)
        if c.final_softcap is not None:
            logits = c.final_softcap * jnp.tanh(logits / c.final_softcap)
        logits = place(logits, "batch", "length", "vocab")
        if cache is None:
            return logits
        return logits, KVCache(stacked[0], stacked[1], kv_ids, kv_positions, start + length)
