"""`Trainer.generate`: batched prompts of different lengths, the KV cache against the plain re-run,
sampling options and seeds, end-of-sequence stops, one compilation per prompt bucket, text
through a tokenizer, and dp/fsdp against one device (8 virtual CPU devices, conftest.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import TinyLM, TinyLMModule, count_compiles, quiet_trainer

import fitjax as fj
from fitjax.loop import _prompts

PROMPTS = [[3, 7, 1, 9, 4], [5, 2], [8, 8, 6, 1, 2, 3, 4, 5, 6, 7, 1, 2, 30], [11]]
NEW = 8  # every test generates this many tokens: they share the compiled programs of one module


@pytest.fixture(scope="module")
def built():
    """A module whose weights generation built (a Linen model initialised from its seed: random
    weights, logits far from uniform), shared by the tests so they share compilations."""
    module = TinyLMModule()
    with pytest.warns(UserWarning, match="never fitted nor loaded"):
        out = quiet_trainer(strategy="single").generate(module, [[1, 2]], max_new_tokens=NEW, temperature=0)
    assert len(out[0]) == NEW and module.variables is not None
    return module


@pytest.fixture(scope="module")
def single():
    return quiet_trainer(strategy="single")


def test_bucket_is_a_power_of_two_or_one_and_a_half_times_one():
    assert [_prompts.bucket(n) for n in (1, 16, 17, 24, 25, 33, 49, 65, 97, 129)] == \
        [16, 16, 24, 24, 32, 48, 64, 96, 128, 192]


def test_layout_left_pads_and_puts_padding_after_each_prompt():
    batch = _prompts.layout([np.array([7, 8, 9]), np.array([5])], rows=4, length=4)
    np.testing.assert_array_equal(batch["tokens"][:2], [[0, 7, 8, 9], [0, 0, 0, 5]])
    np.testing.assert_array_equal(batch["positions"][:2], [[3, 0, 1, 2], [1, 2, 3, 0]])
    np.testing.assert_array_equal(batch["segment_ids"], [[0, 1, 1, 1], [0, 0, 0, 1], [0] * 4, [0] * 4])
    np.testing.assert_array_equal(batch["lengths"], [3, 1, 0, 0])


def test_cache_equals_the_plain_rerun_and_each_row_its_own_generation(built, single):
    cached = single.generate(built, PROMPTS, max_new_tokens=NEW, temperature=0)
    assert cached == single.generate(built, PROMPTS, max_new_tokens=NEW, temperature=0, use_cache=False)
    assert [len(row) for row in cached] == [NEW] * 4
    assert [single.generate(built, prompt, max_new_tokens=NEW, temperature=0) for prompt in PROMPTS] == cached
    # sampled: the same draws whichever path computes the logits
    options = dict(max_new_tokens=NEW, temperature=1.0, top_k=10, top_p=0.9, seed=3)
    assert single.generate(built, PROMPTS, **options) == single.generate(built, PROMPTS, use_cache=False, **options)


def test_greedy_follows_the_argmax_of_the_models_own_logits(built, single):
    """Each greedy token is the argmax of the model's logits over the prompt and the tokens so far."""
    prompt = PROMPTS[0]
    new = single.generate(built, prompt, max_new_tokens=NEW, temperature=0)
    logits = jax.jit(TinyLM().apply)({"params": built.variables[0]}, jnp.asarray([prompt + new]))[0]
    np.testing.assert_array_equal(logits[len(prompt) - 1:-1].argmax(-1), new)


def test_seeded_sampling_repeats_and_options_shape_the_draws(built, single):
    sample = lambda **kw: single.generate(built, PROMPTS, max_new_tokens=NEW, **kw)  # noqa: E731
    assert sample(temperature=1.0, seed=1) == sample(temperature=1.0, seed=1)
    assert sample(temperature=1.0, seed=1) != sample(temperature=1.0, seed=2)
    greedy = sample(temperature=0)
    assert sample(temperature=1.0, top_k=1, seed=5) == greedy  # one token left: the argmax
    assert sample(temperature=0.7, top_p=1e-6, seed=5) == greedy  # the smallest set: the top token
    assert sample(temperature=1.0, top_k=2, seed=1) != sample(temperature=1.0, top_k=2, seed=2)


def test_rows_stop_at_their_end_of_sequence_token(built, single):
    free = single.generate(built, PROMPTS, max_new_tokens=NEW, temperature=0)
    eos = free[0][3]
    stopped = single.generate(built, PROMPTS, max_new_tokens=NEW, temperature=0, eos_token_id=[eos, 39])
    for row, full in zip(stopped, free):
        cut = full.index(eos) + 1 if eos in full else len(full)
        assert row == full[:cut]  # up to and including the first end-of-sequence token
    assert len(stopped[0]) == free[0].index(eos) + 1 < NEW


def test_one_compilation_per_prompt_bucket(built, single):
    single.generate(built, [[1, 2, 3]], max_new_tokens=NEW, temperature=0)
    with count_compiles() as compiles:
        single.generate(built, [[4, 5, 6, 7, 8, 9, 10]], max_new_tokens=NEW, temperature=0)  # the same bucket
        single.generate(built, [[4, 5]], max_new_tokens=NEW, temperature=0.5, top_k=3, seed=9, eos_token_id=2)
    assert sum(compiles.values()) == 0, compiles
    with count_compiles() as compiles:
        single.generate(built, [list(range(1, 20))], max_new_tokens=NEW, temperature=0)  # the next bucket
    assert compiles == {"prefill": 1, "decode": 1}, compiles  # the prompt's pass, and the chunks' loop


@pytest.mark.parametrize("strategy", ["dp", "fsdp"])
def test_dp_and_fsdp_generate_what_one_device_does(built, single, strategy):
    sharded = quiet_trainer(strategy=fj.strategies.FSDP(min_size_to_shard=1) if strategy == "fsdp" else strategy)
    for options in (dict(temperature=0), dict(temperature=1.0, top_p=0.9, seed=4)):
        expected = single.generate(built, PROMPTS, max_new_tokens=NEW, **options)
        assert sharded.generate(built, PROMPTS, max_new_tokens=NEW, **options) == expected


def test_text_prompts_go_through_the_modules_tokenizer(built, single):
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {ch: i for i, ch in enumerate("abcdefghijklmnopqrstuvwxyz .")}
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="."))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Split("", "isolated")
    tokenizer.decoder = tokenizers.decoders.Fuse()
    built.tokenizer = tokenizer
    try:
        texts = single.generate(built, ["the cat sat", "a dog", "on", "the mat"], max_new_tokens=NEW, temperature=0)
        ids = single.generate(built, [tokenizer.encode(t).ids for t in ("the cat sat", "a dog", "on", "the mat")],
                              max_new_tokens=NEW, temperature=0)
        one = single.generate(built, "a dog", max_new_tokens=NEW, temperature=0)
    finally:
        del built.tokenizer
    assert texts == [tokenizer.decode(row) for row in ids] and one == texts[1]
    assert all(isinstance(t, str) and t for t in texts)


def test_a_generation_past_the_models_positions_is_refused_before_compiling(built, single):
    """TinyLM has 128 learned positions: 120 prompt tokens and 8 new ones fit exactly; one more
    token is refused with what to pass instead, and nothing is compiled for it."""
    prompt = list(np.arange(120) % 38 + 1)  # ids of the 40-token vocabulary
    assert len(single.generate(built, [prompt], max_new_tokens=8, eos_token_id=None)[0]) == 8
    with count_compiles() as compiles:
        with pytest.raises(ValueError, match=r"the longest prompt \(120 tokens\) and max_new_tokens=9 need 129 "
                                             r"positions; the model has 128 \(TinyLM.max_positions.*Pass "
                                             r"max_new_tokens <= 8, or shorten the prompt to 119 tokens"):
            single.generate(built, [[1, 2], prompt], max_new_tokens=9)
        with pytest.raises(ValueError, match=r"Shorten the prompt to at most 120 tokens"):
            single.generate(built, [prompt * 2], max_new_tokens=8)
    assert sum(compiles.values()) == 0


@pytest.mark.parametrize("kwargs, match", [
    (dict(max_new_tokens=0), r"max_new_tokens=\.\.\.\) must be a positive int"),
    (dict(temperature=-1), r"temperature=\.\.\.\) must be a number >= 0"),
    (dict(top_k=0), r"top_k=\.\.\.\) must be None .* got 0"),
    (dict(top_p=1.5), r"top_p=\.\.\.\) must be None or a number in \(0, 1\]"),
    (dict(eos_token_id="x"), r"eos_token_id=\.\.\.\) must be None, a token id \(an int .*or a list of them; got 'x'"),
    # int32's limits (ids and positions are int32 on the devices): not NumPy's or JAX's overflow
    (dict(max_new_tokens=2**40), r"max_new_tokens=\.\.\.\) must be at most 2,147,483,631 .*got 1099511627776"),
    (dict(prompts=[[1, 2**40]]), r"prompt 0 has token id 1099511627776 at position 1, which int32 cannot hold"),
    (dict(prompts=[[1], np.array([2, 3, -2**40])]), r"prompt 1 has token id -1099511627776 at position 2"),
    (dict(eos_token_id=[2, 2**40]), r"eos_token_id=\.\.\.\) must be None, a token id \(an int from 0 to "
                                    r"2,147,483,647.*got \[2, 1099511627776\]"),
    (dict(prompts=["text"]), r"text needs a tokenizer; set `module.tokenizer`"),
    (dict(prompts=[[1, 2], []]), r"prompt 1 has no tokens"),
    (dict(prompts=[[1.5, 2]]), r"prompt 0 is \[1.5, 2\]"),
])
def test_arguments_are_checked_at_the_call(built, single, kwargs, match):
    prompts = kwargs.pop("prompts", [[1, 2]])
    with pytest.raises(ValueError, match=match):
        single.generate(built, prompts, **kwargs)


def test_generate_takes_the_options_and_defaults_of_generation_options():
    """`Trainer.generate`'s options are `GenerationOptions`' fields, with its defaults (one place
    says them: a new option is a field there and a keyword here)."""
    import dataclasses
    import inspect

    parameters = inspect.signature(fj.Trainer.generate).parameters
    fields = dataclasses.fields(fj.GenerationOptions)
    assert [name for name in parameters if name not in ("self", "module", "prompts")] == [f.name for f in fields]
    assert all(parameters[f.name].default == f.default for f in fields)
    options = fj.GenerationOptions(temperature=1, top_p=1, eos_token_id=np.int64(7))
    assert (options.temperature, options.top_p, options.eos_token_id, options.eos) == (1.0, 1.0, (7,), (7,))
    assert type(options.temperature) is float and fj.GenerationOptions().eos == ()
    with pytest.raises(ValueError, match=r"^GenerationOptions\(eos_token_id=\.\.\.\) .*got 7.5"):
        fj.GenerationOptions(eos_token_id=7.5)
