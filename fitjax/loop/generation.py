"""Generation: what `Trainer.generate` runs, an evaluation program beside validate, test and
predict. Prompts in (token ids, or text through the module's tokenizer), continuations out.

Its rooms: the options (`fitjax.GenerationOptions`), the prompts' host side (text and
ids in, the batch layout, the answer out: `_prompts`), the programs on the devices (`_decode`),
and here the generation's run and the weights it runs on (`variables_for`).

Two jitted programs per prompt-length bucket run the generation on the devices: a prefill of
the prompts that fills the model's KV cache, then a `lax.while_loop` of one-token steps, each
reading the cache instead of re-running the sequence, called again for the next chunk of tokens
until every row has produced an end-of-sequence token or `max_new_tokens`. Between chunks the
host reads two numbers (the tokens made, whether all rows stopped) and sees Ctrl-C: a chunk lasts
about `CHUNK_S` (its length, an input of the program, is sized from the tokens per second so
far), so Ctrl-C stops a generation within about a second, where one program for the whole
generation ran to its end (103 s for a 100 s generation). The chunks' host round trips cost
under 1% of a generation's time.

A model whose positions end (a table of learned positions: GPT-2's 1024) says where with an int
`max_positions`; a prompt that would run past it is refused before anything is compiled, where
`transformers` fails inside GPT-2's position lookup (rotary models have no such end: None).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import signal
import time
import warnings
from typing import Any, Iterator

import jax
import jax.numpy as jnp
import numpy as np

from fitjax import module as module_lib
from fitjax import precision as precision_lib
from fitjax import step as step_lib
from fitjax import strategies
from fitjax.loop import _decode, _interrupt, _prompts
from fitjax.loop import _token_ids as prompt_ids
from fitjax._generation_options import INT32_MAX, GenerationOptions

__all__ = ["generate", "variables_for"]

CHUNK_S = 0.25  # a chunk of generated tokens lasts about this long: Ctrl-C waits for at most one
_FIRST_CHUNK = 16  # tokens of the first chunk, before any speed is measured
_GROWTH = 8  # a chunk is at most this many times its predecessor (a first measure can be off)


def generate(module: Any, prompts: Any, options: GenerationOptions, *, variables: tuple, strategy: Any,
             policy: precision_lib.Precision) -> Any:
    """The continuations of `prompts` (see `Trainer.generate`), generated with `variables`
    (`(params, model_state)` placed in `strategy`'s shardings).

    A Ctrl-C stops the generation after the chunk of tokens in flight (about `CHUNK_S`) and
    raises `KeyboardInterrupt` whose `generated` holds the tokens made so far, in the form this
    returns (`Trainer.generate` raises it as `Interrupted`); a second Ctrl-C raises at once."""
    tokenizer = getattr(module, "tokenizer", None)
    read = _prompts.read_prompts(prompts, tokenizer)
    prompt_ids.check_prompts(read.tokens, prompt_ids.generation_vocab(module, variables))
    longest = max(len(p) for p in read.tokens)
    _check_positions(module.step_spec().binding.model, longest, options.max_new_tokens)
    length = _prompts.bucket(longest)
    if length + options.max_new_tokens > INT32_MAX:
        raise ValueError(f"Trainer.generate: the prompts' {length} positions (the longest prompt's bucket) and "
                         f"max_new_tokens={options.max_new_tokens:,} pass int32's {INT32_MAX:,} (positions are "
                         f"int32 on the devices). Pass max_new_tokens <= {INT32_MAX - length:,}.")
    shards = strategy.num_batch_shards
    rows = math.ceil(len(read.tokens) / shards) * shards
    batch = _prompts.layout(read.tokens, rows=rows, length=length)
    prefill, decode = _decode.programs(module, options, policy, strategy)
    inputs = strategy.put(batch, strategy.batch_sharding)
    scalars = _decode.inputs(options, strategy)
    with _stop_on_ctrl_c() as ctrl_c:
        carry = prefill(*variables, inputs, scalars)
        made, chunk, out = 0, _FIRST_CHUNK, None
        while made < options.max_new_tokens and not ctrl_c.requested:
            before, began = made, time.monotonic()
            carry, out, status = decode(*variables, carry, inputs, scalars, np.int32(min(options.max_new_tokens,
                                                                                         made + chunk)))
            # sync point, once a chunk: the tokens made and whether every row has stopped
            made, finished = (int(v) for v in np.asarray(status.addressable_data(0)))
            if finished:
                break
            rate = (made - before) / max(time.monotonic() - began, 1e-6)  # tokens a second (the first: with compiling)
            chunk = max(1, min(_GROWTH * chunk, int(rate * CHUNK_S)))
        # replicated: every process reads the whole result
        new = np.zeros((rows, 0), np.int32) if out is None else np.asarray(out.addressable_data(0))
        results = read.answer(new[:len(read.tokens), :made], options.eos, tokenizer)
        if ctrl_c.requested:
            stopped = KeyboardInterrupt()
            stopped.generated = results
            raise stopped
    return results


class _CtrlC:
    requested = False


@contextlib.contextmanager
def _stop_on_ctrl_c() -> Iterator[_CtrlC]:
    """While a generation runs, a Ctrl-C asks it to stop after the chunk in flight (the handler
    only records it: raised inside a dispatch it could leave the donated cache half-used); a
    second one is the handler's from before (`Trainer.generate`'s: raised at once). From the main
    thread only (Python's rule); the previous handler is back after."""
    ctrl_c = _CtrlC()
    if not _interrupt.listening():  # another thread, or a process that ignores SIGINT
        yield ctrl_c
        return
    previous = signal.getsignal(signal.SIGINT)

    def on_sigint(signum, frame):
        if ctrl_c.requested and callable(previous):
            previous(signum, frame)
        ctrl_c.requested = True

    signal.signal(signal.SIGINT, on_sigint)
    try:
        yield ctrl_c
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)


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
