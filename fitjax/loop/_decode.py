"""Generation's programs on the devices: a prefill of the prompts that fills the model's KV cache,
and a decode of one chunk of tokens (a `lax.while_loop` of one-token steps, each reading the
cache instead of re-running the sequence), both jitted through `fitjax.step.compiling` and kept by the
module per option set and strategy (`programs`); the options' traced values (`inputs`).

The model contract (what `LitModule.generate_step` calls by default, and what the models in
`fitjax.models` and the GPT example implement): `model(tokens, positions=..., segment_ids=...,
cache=None)` returns logits [batch, length, vocab]; with `cache=` a cache that
`model.init_cache(batch, max_length, dtype)` made it returns `(logits, new_cache)`, the chunk's
keys and values written, and masks attention by the (query, key) positions and segment ids
(`fitjax.nn.attention`'s pairs). A model without `init_cache` generates without a cache: each
new token re-runs the whole sequence (the reference the cache is tested against).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from fitjax import precision as precision_lib
from fitjax import step as step_lib
from fitjax._generation_options import INT32_MAX, GenerationOptions
from fitjax.loop._sampling import next_tokens
from fitjax.step import compiling

__all__ = ["inputs", "programs"]

_KEY_SALT = 0x6E7  # the dropout streams a generation step may draw apart from the sampling's
_EOS_SLOTS = 4  # end-of-sequence ids are an input of this size (more: one more compilation)
_KEPT = 8  # compiled programs kept per module (option sets x strategies)


def inputs(options: GenerationOptions, strategy: Any) -> dict[str, jax.Array]:
    """The options the programs take as values (changing them compiles nothing), replicated, in
    `next_tokens`' terms: top_k 0 and top_p 1.0 keep every token."""
    eos = np.full(max(_EOS_SLOTS, len(options.eos)), -1, np.int32)  # -1: no token stops a row
    eos[:len(options.eos)] = options.eos
    return strategy.put({"temperature": np.float32(options.temperature),
                         "top_k": np.int32(min(options.top_k or 0, INT32_MAX)),  # past the vocabulary: all
                         "top_p": np.float32(1.0 if options.top_p is None else options.top_p),
                         "eos": eos, "seed": np.uint32(options.seed % 2**32)}, strategy.replicated)


def programs(module: Any, options: GenerationOptions, policy: precision_lib.Precision, strategy: Any
              ) -> tuple[Callable, Callable]:
    """`(prefill, decode)` for `module` (see `_make_programs`), made once per option set and
    strategy."""
    spec = module.step_spec()
    # the mesh and the logical axis rules (FSDP's) a program is traced with: trainers alike share it
    key = (spec.binding, type(module).generate_step, policy, options.max_new_tokens, options.use_cache,
           strategy.replicated, repr(getattr(strategy, "rules", None)))
    # kept by the module (they hold it: they trace its `generate_step`), dropped with it; jit's
    # own cache keys each on the prompts' shapes
    kept = module.__dict__.setdefault("_generation_programs", {})
    if key not in kept:
        if len(kept) >= _KEPT:  # the oldest goes (a new binding after `apply_lora` makes all old)
            kept.pop(next(iter(kept)))
        prefill, decode = _make_programs(spec, module.generate_step, policy, options, strategy.replicated)
        # the inputs arrive placed (jit follows their shardings); the carry (the KV cache) is
        # donated from chunk to chunk
        kept[key] = (compiling.jit(strategy, prefill), compiling.jit(strategy, decode, donate_argnums=(2,)))
    return kept[key]


def _make_programs(spec: step_lib.ModuleSpec, generate_step: Callable, policy: precision_lib.Precision,
                   options: GenerationOptions, replicated: Any) -> tuple[Callable, Callable]:
    """`prefill(params, model_state, batch, scalars) -> carry` and `decode(params, model_state,
    carry, batch, scalars, stop) -> (carry, tokens, status)`: the tokens up to index `stop`
    (or until every row stopped), `tokens` [rows, max_new_tokens] and `status` [made, all
    stopped] replicated (every process reads them)."""
    max_new = options.max_new_tokens

    def parts(params, model_state, batch, scalars):
        tokens, positions, segment_ids, lengths = (batch[k] for k in ("tokens", "positions", "segment_ids",
                                                                      "lengths"))
        params = policy.cast_compute(params)
        rng = jax.random.fold_in(jax.random.key(scalars["seed"]), _KEY_SALT)

        def call(fn, *args):
            with spec.mode(False):
                return spec.binding.apply(fn, params, model_state, rng, *args, train=False)[0]

        def forward(tokens, positions, segment_ids, cache):
            def fn(model, tokens, positions, segment_ids, cache):
                logits, cache = generate_step(model, tokens, positions=positions, segment_ids=segment_ids, cache=cache)
                return logits.astype(jnp.float32), cache
            return call(fn, tokens, positions, segment_ids, cache)

        cached = call(lambda model: hasattr(model, "init_cache")) if options.use_cache is None else options.use_cache
        return tokens, positions, segment_ids, lengths, call, forward, cached

    def prefill(params, model_state, batch, scalars):
        tokens, positions, segment_ids, lengths, call, forward, cached = parts(params, model_state, batch, scalars)
        rows, length = tokens.shape
        if cached:
            cache = call(lambda model: _init_cache(model, rows, length + max_new, policy.compute_dtype))
            logits, memory = forward(tokens, positions, segment_ids, cache)
            logits = logits[:, -1]
        else:  # the whole sequence each step: the prompt, then the generated tokens as they come
            ahead = lengths[:, None] + jnp.arange(max_new, dtype=jnp.int32)
            memory = (jnp.concatenate([tokens, jnp.zeros((rows, max_new), jnp.int32)], axis=1),
                      jnp.concatenate([positions, ahead], axis=1),
                      jnp.concatenate([segment_ids, jnp.ones((rows, max_new), jnp.int32)], axis=1))
            logits = forward(*memory, None)[0][:, length - 1]
        return jnp.int32(0), logits, memory, jnp.zeros((rows, max_new), jnp.int32), lengths == 0

    def chunk(params, model_state, carry, batch, scalars, stop):
        tokens, positions, segment_ids, lengths, call, forward, cached = parts(params, model_state, batch, scalars)
        rows, length = tokens.shape
        eos, key = scalars["eos"], jax.random.key(scalars["seed"])

        def step(state):
            t, logits, memory, out, done = state
            token = next_tokens(logits, jax.random.fold_in(key, t), scalars["temperature"], scalars["top_k"],
                                scalars["top_p"])
            token = jnp.where(done, 0, token)  # a stopped row's tokens are cut from the result
            out = jax.lax.dynamic_update_slice_in_dim(out, token[:, None], t, axis=1)
            done = done | jnp.isin(token, eos)
            if cached:
                ones = jnp.ones((rows, 1), jnp.int32)
                logits, memory = forward(token[:, None], (lengths + t)[:, None], ones, memory)
                logits = logits[:, 0]
            else:
                seq, pos, seg = memory
                seq = jax.lax.dynamic_update_slice_in_dim(seq, token[:, None], length + t, axis=1)
                memory = (seq, pos, seg)
                logits = jax.lax.dynamic_index_in_dim(forward(seq, pos, seg, None)[0], length + t, axis=1,
                                                      keepdims=False)
            return t + 1, logits, memory, out, done

        def going(state):
            t, _, _, _, done = state
            return (t < stop) & ~jnp.all(done)

        carry = jax.lax.while_loop(going, step, carry)
        t, _, _, out, done = carry
        status = jnp.stack([t, jnp.all(done).astype(jnp.int32)])
        return carry, jax.lax.with_sharding_constraint((out, status), replicated)

    def decode(params, model_state, carry, batch, scalars, stop):
        carry, (out, status) = chunk(params, model_state, carry, batch, scalars, stop)
        return carry, out, status

    return prefill, decode


def _init_cache(model: Any, rows: int, total: int, dtype: Any) -> Any:
    init = getattr(model, "init_cache", None)
    if init is None:
        raise ValueError(f"Trainer.generate(use_cache=True): {type(model).__name__} has no "
                         "`init_cache(batch, max_length, dtype)` method; pass use_cache=None or False to "
                         "generate without a KV cache (each new token re-runs the whole sequence).")
    return init(rows, total, dtype)

