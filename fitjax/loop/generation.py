"""Generation: what `Trainer.generate` runs, an evaluation program beside validate, test and
predict. Prompts in (token ids, or text through the module's tokenizer), continuations out.

One jitted program per prompt-length bucket does the whole generation on the devices: a
prefill of the prompts that fills the model's KV cache, then a `lax.while_loop` of one-token
steps, each reading the cache instead of re-running the sequence, until every row has produced
an end-of-sequence token or `max_new_tokens`. The host waits once, for the result.

The batch layout (`layout`): prompts are left-padded to the bucket's length (16, 24, 32, 48,
64, 96, ... tokens), so a second call whose longest prompt falls in the same bucket reuses the
compiled program. Row i's prompt of n_i tokens has positions 0..n_i-1 (as `transformers`
numbers a left-padded prompt); its padding has segment id 0, which no real token attends to,
and the positions right after the prompt (n_i, n_i+1, ...). So a model may write its cache at
its own index (the same slots for every row: `fitjax.models`) or at `positions` (a padding
slot is then one a generated token overwrites before any query sees it): either way each row
generates exactly what it would alone. Rows added to divide the batch over the devices start
finished.

The model contract (what `LitModule.generate_step` calls by default, and what the models in
`fitjax.models` and the GPT example implement): `model(tokens, positions=..., segment_ids=...,
cache=None)` returns logits [batch, length, vocab]; with `cache=` a cache that
`model.init_cache(batch, max_length, dtype)` made it returns `(logits, new_cache)`, the chunk's
keys and values written, and masks attention by the (query, key) positions and segment ids
(`fitjax.nn.attention`'s pairs). A model without `init_cache` generates without a cache: each
new token re-runs the whole sequence (the reference the cache is tested against). A model whose
positions end (a table of learned positions: GPT-2's 1024) says where with an int
`max_positions`; a prompt that would run past it is refused before anything is compiled, where
`transformers` fails inside GPT-2's position lookup (rotary models have no such end: None).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fitjax import module as module_lib
from fitjax import precision as precision_lib
from fitjax import step as step_lib
from fitjax import strategies
from fitjax.loop import _token_ids as prompt_ids
from fitjax.loop._sampling import next_tokens

__all__ = ["GenerateOptions", "Prompts", "bucket", "generate", "layout", "read_prompts", "default_eos",
           "variables_for"]

_FLOOR = 16  # the smallest prompt bucket: a few tokens of padding cost nothing next to a compile
_KEY_SALT = 0x6E7  # the dropout streams a generation step may draw apart from the sampling's
_EOS_SLOTS = 4  # end-of-sequence ids are an input of this size (more: one more compilation)
_KEPT = 8  # compiled programs kept per module (option sets x strategies)


@dataclasses.dataclass(frozen=True)
class GenerateOptions:
    """`Trainer.generate`'s options, checked (`make`); the static ones key the compiled program."""

    max_new_tokens: int
    temperature: float
    top_k: int | None
    top_p: float | None
    seed: int
    eos: tuple[int, ...]  # a row stops after producing any of these
    use_cache: bool | None  # None: when the model has `init_cache`

    @classmethod
    def make(cls, *, max_new_tokens: Any, temperature: Any, top_k: Any, top_p: Any, seed: Any,
             eos_token_id: Any, use_cache: Any) -> "GenerateOptions":
        where = "Trainer.generate"
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"{where}(max_new_tokens=...) must be a positive int (tokens generated per "
                             f"prompt at most); got {max_new_tokens!r}.")
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature >= 0:
            raise ValueError(f"{where}(temperature=...) must be a number >= 0 (0: greedy, the most likely "
                             f"token each step; 1: the model's distribution); got {temperature!r}.")
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
            raise ValueError(f"{where}(top_k=...) must be None (every token) or a positive int (draw among "
                             f"the k most likely tokens); got {top_k!r}.")
        if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, (int, float))
                                  or not 0 < top_p <= 1):
            raise ValueError(f"{where}(top_p=...) must be None or a number in (0, 1] (draw among the most "
                             f"likely tokens holding that probability mass); got {top_p!r}.")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"{where}(seed=...) must be an int (the sampling's random key); got {seed!r}.")
        if use_cache not in (None, True, False):
            raise ValueError(f"{where}(use_cache=...) must be None (a KV cache when the model has "
                             f"`init_cache`), True or False; got {use_cache!r}.")
        return cls(max_new_tokens, float(temperature), top_k, None if top_p is None else float(top_p), seed,
                   _token_ids(eos_token_id), use_cache)


def default_eos(tokenizer: Any, config: Any) -> Any:
    """The end-of-sequence id(s) generation stops at when not given: the tokenizer's, else the
    model config's `eos_token_id` (a dict config or an object); None with neither."""
    for source in (tokenizer, config):
        value = source.get("eos_token_id") if isinstance(source, dict) else getattr(source, "eos_token_id", None)
        if value is not None:
            return value
    return None


def _token_ids(value: Any) -> tuple[int, ...]:
    values = () if value is None else (value,) if isinstance(value, (int, np.integer)) else tuple(value)
    if any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0 for v in values):
        raise ValueError(f"Trainer.generate(eos_token_id=...) must be None, a token id or a list of them; "
                         f"got {value!r}.")
    return tuple(int(v) for v in values)


def bucket(length: int) -> int:
    """The padded prompt length of prompts at most `length` long: 16, 24, 32, 48, 64, 96, ...
    (a power of two or 1.5 times one), so prompts of nearby lengths share one compilation and,
    past 16, less than a third of a row is padding."""
    size = _FLOOR
    while size < length:
        size = size * 3 // 2 if size & (size - 1) == 0 else size * 4 // 3
    return size


@dataclasses.dataclass(frozen=True)
class Prompts:
    """The prompts as token ids, and how the results go back: as text (the prompts were text),
    and as one result (one prompt was given, not a list)."""

    tokens: list[np.ndarray]
    text: bool
    single: bool


def read_prompts(prompts: Any, tokenizer: Any) -> Prompts:
    """Token id lists or arrays (one prompt, a list of them, or a 2-D array), or text (one string
    or a list) when there is a tokenizer."""
    single = isinstance(prompts, str) or _is_ids(prompts)
    many = [prompts] if single else list(prompts)
    if not many:
        raise ValueError("Trainer.generate(prompts=...) is empty: pass a prompt or a list of them.")
    text = [isinstance(p, str) for p in many]
    if any(text):
        if not all(text):
            raise ValueError("Trainer.generate(prompts=...) mixes text and token ids; pass one kind.")
        if tokenizer is None:
            raise ValueError(f"Trainer.generate(prompts={many[0]!r}, ...): text needs a tokenizer; set "
                             "`module.tokenizer` (e.g. `transformers.AutoTokenizer.from_pretrained(folder)` in "
                             "__init__) or pass token ids.")
        ids = [_encode(tokenizer, p) for p in many]
    else:
        ids = []
        for i, p in enumerate(many):
            if not _is_ids(p):
                raise ValueError(f"Trainer.generate(prompts=...): prompt {i} is {p!r}; a prompt is a list or "
                                 "1-D array of token ids (ints), or text with `module.tokenizer` set.")
            ids.append(np.asarray(p, dtype=np.int32))
    for i, p in enumerate(ids):
        if p.size == 0:
            raise ValueError(f"Trainer.generate(prompts=...): prompt {i} has no tokens; every prompt needs one.")
    return Prompts(ids, all(text), single)


def _is_ids(p: Any) -> bool:
    """Whether `p` is one prompt of token ids: a 1-D int array or a list of ints."""
    if isinstance(p, (np.ndarray, jax.Array)):
        return p.ndim == 1 and p.dtype.kind in "iu"
    return isinstance(p, (list, tuple)) and all(isinstance(t, (int, np.integer)) and not isinstance(t, bool)
                                                for t in p)


def _encode(tokenizer: Any, text: str) -> np.ndarray:
    encoded = tokenizer.encode(text)  # a transformers tokenizer: ids; a `tokenizers.Tokenizer`: `.ids`
    return np.asarray(getattr(encoded, "ids", encoded), dtype=np.int32)


def _decode(tokenizer: Any, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=True)


def layout(prompts: Sequence[np.ndarray], *, rows: int, length: int) -> dict[str, np.ndarray]:
    """The left-padded batch (see the module doc): `tokens`, `positions`, `segment_ids` int32
    [rows, length], `lengths` [rows] (0 for the rows added beyond the prompts). Padding is token
    0, an id every vocabulary has (an id past the table would read NaN into the masked values)."""
    tokens = np.zeros((rows, length), np.int32)
    lengths = np.zeros(rows, np.int32)
    segment_ids = np.zeros((rows, length), np.int32)
    positions = np.tile(np.arange(length, dtype=np.int32), (rows, 1))
    for i, prompt in enumerate(prompts):
        n = len(prompt)
        tokens[i, length - n:] = prompt
        segment_ids[i, length - n:] = 1
        positions[i] = np.concatenate([np.arange(n, length), np.arange(n)])  # padding: after the prompt
        lengths[i] = n
    return {"tokens": tokens, "positions": positions, "segment_ids": segment_ids, "lengths": lengths}


# ------------------------------------------------------------------------------- the program

def generate(module: Any, prompts: Any, options: GenerateOptions, *, variables: tuple, strategy: Any,
             policy: precision_lib.Precision) -> Any:
    """The continuations of `prompts` (see `Trainer.generate`), generated with `variables`
    (`(params, model_state)` placed in `strategy`'s shardings)."""
    tokenizer = getattr(module, "tokenizer", None)
    read = read_prompts(prompts, tokenizer)
    prompt_ids.check_prompts(read.tokens, prompt_ids.generation_vocab(module, variables))
    longest = max(len(p) for p in read.tokens)
    _check_positions(module.step_spec().binding.model, longest, options.max_new_tokens)
    shards = strategy.num_batch_shards
    rows = math.ceil(len(read.tokens) / shards) * shards
    batch = layout(read.tokens, rows=rows, length=bucket(longest))
    program = _program(module, options, policy, strategy)
    inputs = strategy.put(batch, strategy.batch_sharding)
    eos = np.full(max(_EOS_SLOTS, len(options.eos)), -1, np.int32)  # -1: no token stops a row
    eos[:len(options.eos)] = options.eos
    scalars = strategy.put({"temperature": np.float32(options.temperature), "top_k": np.int32(options.top_k or 0),
                            "top_p": np.float32(1.0 if options.top_p is None else options.top_p),
                            "eos": eos, "seed": np.uint32(options.seed % 2**32)}, strategy.replicated)
    new, counts = program(*variables, inputs, scalars)
    # sync point: the one wait of a generation (replicated: every process reads the whole result)
    new, counts = np.asarray(new.addressable_data(0)), np.asarray(counts.addressable_data(0))
    results = [new[i, :counts[i]].tolist() for i in range(len(read.tokens))]
    if read.text:
        results = [_decode(tokenizer, ids) for ids in results]
    return results[0] if read.single else results


def _check_positions(model: Any, longest: int, max_new: int) -> None:
    """Refuses a generation that would place tokens past the model's `max_positions` (a learned
    position table's size), where every later position would read the table's last row."""
    limit = getattr(model, "max_positions", None)
    if isinstance(limit, bool) or not isinstance(limit, int) or longest + max_new <= limit:
        return
    name = f"{type(model).__name__}.max_positions"
    if longest >= limit:
        fix = f"shorten the prompt to at most {limit - max_new} tokens (keep its end), or generate fewer"
    else:
        fix = f"pass max_new_tokens <= {limit - longest}, or shorten the prompt to {limit - max_new} tokens"
    raise ValueError(f"Trainer.generate: the longest prompt ({longest} tokens) and max_new_tokens={max_new} "
                     f"need {longest + max_new} positions; the model has {limit} ({name}: its table of learned "
                     f"positions ends there). {fix[0].upper()}{fix[1:]}.")


def _program(module: Any, options: GenerateOptions, policy: precision_lib.Precision, strategy: Any) -> Callable:
    spec = module.step_spec()
    key = (spec.binding, type(module).generate_step, policy, options.max_new_tokens, options.use_cache,
           strategy.replicated)
    # kept by the module (they hold it: they trace its `generate_step`), dropped with it; jit's
    # own cache keys each on the prompts' shapes
    programs = module.__dict__.setdefault("_generation_programs", {})
    if key not in programs:
        if len(programs) >= _KEPT:  # the oldest goes (a new binding after `apply_lora` makes all old)
            programs.pop(next(iter(programs)))
        run = _make_program(spec, module.generate_step, policy, options)
        # the inputs arrive placed (jit follows their shardings); every process reads the whole result
        programs[key] = jax.jit(strategy.traced_on_mesh(run), out_shardings=strategy.replicated)
    return programs[key]


def _make_program(spec: step_lib.ModuleSpec, generate_step: Callable, policy: precision_lib.Precision,
                  options: GenerateOptions) -> Callable:
    max_new = options.max_new_tokens

    def run(params, model_state, batch, scalars):
        tokens, positions, segment_ids, lengths = (batch[k] for k in ("tokens", "positions", "segment_ids",
                                                                      "lengths"))
        rows, length = tokens.shape
        eos, key = scalars["eos"], jax.random.key(scalars["seed"])
        total = length + max_new
        params = policy.cast_compute(params)
        rng = jax.random.fold_in(key, _KEY_SALT)

        def call(fn, *args):
            with spec.mode(False):
                return spec.binding.apply(fn, params, model_state, rng, *args, train=False)[0]

        def forward(tokens, positions, segment_ids, cache):
            def fn(model, tokens, positions, segment_ids, cache):
                logits, cache = generate_step(model, tokens, positions=positions, segment_ids=segment_ids, cache=cache)
                return logits.astype(jnp.float32), cache
            return call(fn, tokens, positions, segment_ids, cache)

        cached = call(lambda model: hasattr(model, "init_cache")) if options.use_cache is None else options.use_cache
        if cached:
            cache = call(lambda model: _init_cache(model, rows, total, policy.compute_dtype))
            logits, memory = forward(tokens, positions, segment_ids, cache)
            logits = logits[:, -1]
        else:  # the whole sequence each step: the prompt, then the generated tokens as they come
            ahead = lengths[:, None] + jnp.arange(max_new, dtype=jnp.int32)
            memory = (jnp.concatenate([tokens, jnp.zeros((rows, max_new), jnp.int32)], axis=1),
                      jnp.concatenate([positions, ahead], axis=1),
                      jnp.concatenate([segment_ids, jnp.ones((rows, max_new), jnp.int32)], axis=1))
            logits = forward(*memory, None)[0][:, length - 1]

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
            return (t < max_new) & ~jnp.all(done)

        out = jnp.zeros((rows, max_new), jnp.int32)
        start = (jnp.int32(0), logits, memory, out, lengths == 0)
        _, _, _, out, _ = jax.lax.while_loop(going, step, start)
        # a row's tokens up to and including its first end-of-sequence token
        stops = jnp.isin(out, eos)
        first = jnp.where(stops.any(axis=1), jnp.argmax(stops, axis=1) + 1, max_new)
        return out, jnp.where(lengths > 0, first, 0).astype(jnp.int32)

    return run


def _init_cache(model: Any, rows: int, total: int, dtype: Any) -> Any:
    init = getattr(model, "init_cache", None)
    if init is None:
        raise ValueError(f"Trainer.generate(use_cache=True): {type(model).__name__} has no "
                         "`init_cache(batch, max_length, dtype)` method; pass use_cache=None or False to "
                         "generate without a KV cache (each new token re-runs the whole sequence).")
    return init(rows, total, dtype)


# ----------------------------------------------------------------------- the weights it runs on

def variables_for(module: Any, held: tuple | None, *, strategy: Any, seed: int, options: step_lib.StepOptions
                  ) -> tuple:
    """`(params, model_state)` placed in `strategy`'s shardings: `held` (the trainer's for this
    module) when given; else the module's own (after a fit or a restore); else built as an
    evaluation stage builds them (the weights `load_weights` names read into their shardings,
    a Linen model initialised), which the module then holds for the next call."""
    if held is not None:
        return held
    spec = module.step_spec()
    if spec.weights is None and spec.variables is not None:
        params, model_state = spec.variables
        abstract = jax.eval_shape(lambda: {"params": params, "model_state": model_state})
        ruled = strategies.with_model_rules(strategy, spec.axis_rules)  # as `step_lib.build` lays them out
        shardings = ruled.state_shardings(abstract, spec.binding.annotations)
        placed = jax.device_put({"params": params, "model_state": model_state}, shardings)
        return placed["params"], placed["model_state"]
    if module_lib.is_unfitted_linen(module):
        warnings.warn(f"Trainer.generate: {type(module).__name__} was never fitted nor loaded; its weights are "
                      "freshly initialised. Fit it first, or load weights (`load_weights`, "
                      "`LitModule.load_from_checkpoint`).", stacklevel=4)

    def trace(model, tokens):  # what initialises a Linen model: one generation step without a cache
        positions = jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)
        return module.generate_step(model, tokens, positions=positions, segment_ids=jnp.ones_like(tokens),
                                    cache=None)[0]

    example = np.zeros((strategy.num_batch_shards, 1), np.int32)
    state, _ = step_lib.build(dataclasses.replace(spec, predict=trace), strategy, example, seed=seed,
                              purpose="predict", options=options)
    module_lib.set_variables(module, state.params, state.model_state)
    return state.params, state.model_state
