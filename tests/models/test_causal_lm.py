"""fitjax.models.CausalLM's calling contract: the KV-cache path equals the whole-sequence path
(left-padded prompts of different lengths, a prompt chunk then one token per call), packed
documents equal the same documents run alone, and a config fitjax cannot run is refused by name."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fitjax import models

SMALL = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64}
CONFIGS = {
    "gpt2": {"model_type": "gpt2", "vocab_size": 64, "n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 64},
    "llama": {"model_type": "llama", **SMALL},
    # a sliding layer and a global one, soft-capped attention and logits, (1 + w) norms
    "gemma2": {"model_type": "gemma2", **SMALL, "sliding_window": 3, "attn_logit_softcapping": 2.0,
               "final_logit_softcapping": 3.0},
}


@functools.cache  # one of each per module: the tests of a family share its compiled init and programs
def model_and_params(family):
    """The model, its `apply` jitted (a call run op by op compiles each op: slower than the whole),
    and random weights (Gemma's norms start at zero and would hide a wrong (1 + w))."""
    model = models.from_config(CONFIGS[family])

    @jax.jit
    def params():
        params = model.init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32))
        leaves, treedef = jax.tree.flatten(params)
        keys = jax.random.split(jax.random.key(1), len(leaves))
        return jax.tree.unflatten(treedef, [x + 0.3 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])

    return model, jax.jit(model.apply), params()


@pytest.mark.parametrize("family", ["gpt2", "gemma2"])  # learned positions; rotary, windows, caps
def test_the_cache_path_equals_the_whole_sequence_for_left_padded_prompts(family):
    model, apply, params = model_and_params(family)
    rng = np.random.default_rng(0)
    lengths, total, prompt = [5, 3], 9, 5  # real prompt tokens per row; tokens in all; prompt columns
    tokens = rng.integers(1, 64, (2, total)).astype(np.int32)
    pads = [prompt - n for n in lengths]
    segment_ids = np.ones((2, total), np.int32)
    positions = np.zeros((2, total), np.int32)
    for row, pad in enumerate(pads):
        segment_ids[row, :pad] = 0
        positions[row, pad:] = np.arange(total - pad)  # real tokens numbered from 0, as transformers does
    whole = apply(params, tokens, positions=positions, segment_ids=segment_ids)

    cache = model.init_cache(2, 12)
    chunk, cache = apply(params, tokens[:, :prompt], positions=positions[:, :prompt],
                         segment_ids=segment_ids[:, :prompt], cache=cache)
    pieces = [chunk]
    for i in range(prompt, total):
        chunk, cache = apply(params, tokens[:, i:i + 1], positions=positions[:, i:i + 1],
                             segment_ids=segment_ids[:, i:i + 1], cache=cache)
        pieces.append(chunk)
    assert int(cache.index) == total
    incremental = np.concatenate(pieces, axis=1)
    for row, pad in enumerate(pads):  # padding's logits mean nothing
        np.testing.assert_allclose(incremental[row, pad:], whole[row, pad:], atol=1e-5, rtol=0)
    # and a row without padding equals the same tokens run alone
    alone = apply(params, tokens[:1, pads[0]:])
    np.testing.assert_allclose(whole[0, pads[0]:], alone[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", ["gpt2", "gemma2"])
def test_packed_documents_equal_each_document_run_alone(family):
    _, apply, params = model_and_params(family)
    rng = np.random.default_rng(1)
    first, second = rng.integers(0, 64, (2, 1, 5)).astype(np.int32)
    packed = np.concatenate([first, second, [[0, 0]]], axis=1).astype(np.int32)
    segment_ids = np.array([[1] * 5 + [2] * 5 + [0] * 2], np.int32)
    positions = np.array([[*range(5), *range(5), 0, 0]], np.int32)
    out = apply(params, packed, positions=positions, segment_ids=segment_ids)
    np.testing.assert_allclose(out[:, :5], apply(params, first), atol=1e-5, rtol=0)
    np.testing.assert_allclose(out[:, 5:10], apply(params, second), atol=1e-5, rtol=0)


def test_the_model_exposes_its_config_and_init_cache_needs_no_parameters():
    model = models.from_config({**CONFIGS["llama"], "bos_token_id": 1, "eos_token_id": [2, 3], "pad_token_id": 0})
    c = model.config
    assert (c.vocab_size, c.bos_token_id, c.eos_token_ids, c.pad_token_id, c.max_position_embeddings) == \
        (64, 1, (2, 3), 0, 64)
    cache = model.init_cache(3, 10, jnp.bfloat16)
    assert len(cache.keys) == len(cache.values) == 2
    assert cache.keys[0].shape == (3, 10, 2, 8) and cache.keys[0].dtype == jnp.bfloat16
    assert cache.segment_ids.shape == cache.positions.shape == (3, 10) and int(cache.index) == 0


@pytest.mark.parametrize("config, named", [
    ({"model_type": "bert"}, "model_type='bert'"),
    ({**CONFIGS["llama"], "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_type='yarn'"),
    ({**CONFIGS["gpt2"], "scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx=True"),
    ({"model_type": "gemma3", "text_config": {}}, "gemma3_text"),
    ({"model_type": "llama", "vocab_size": 10}, "lacks 'num_attention_heads'"),
])
def test_an_architecture_fitjax_cannot_run_is_refused_naming_what_it_lacks(config, named):
    with pytest.raises(ValueError, match=named.replace("(", r"\(").replace("[", r"\[")):
        models.from_config(config)


def test_the_module_loss_of_a_packed_row_weights_each_documents_tokens():
    model, apply, params = model_and_params("llama")
    module = models.CausalLMModule(CONFIGS["llama"])
    loss = jax.jit(lambda p, batch: module.loss(model.bind(p), batch))
    rng = np.random.default_rng(2)
    first, second = rng.integers(0, 64, (2, 1, 5)).astype(np.int32)
    packed = {"tokens": np.concatenate([first, second, [[0, 0]]], axis=1).astype(np.int32),
              "segment_ids": np.array([[1] * 5 + [2] * 5 + [0] * 2], np.int32),
              "positions": np.array([[*range(5), *range(5), 0, 0]], np.int32)}
    total = loss(params, packed)
    alone = [loss(params, {"tokens": doc}) for doc in (first, second)]  # each a mean over 4 targets
    assert int(total.count) == 8  # 4 targets per document; none across the boundary or in padding
    np.testing.assert_allclose(total.sum, 4 * (alone[0] + alone[1]), rtol=1e-5)


def test_the_module_stores_adams_moments_as_asked_and_refuses_an_unknown_storage():
    config = {"model_type": "llama", **SMALL, "hidden_size": 64, "intermediate_size": 128}
    # the states' dtypes only: traced, not run (eagerly each op of the inits compiled on its own)
    params = jax.eval_shape(models.from_config(config).init, jax.random.key(0), jnp.zeros((1, 4), jnp.int32))
    wide = jax.eval_shape(models.CausalLMModule(config).configure_optimizer().init, params)
    narrow = jax.eval_shape(models.CausalLMModule(config, moments="int8").configure_optimizer().init, params)
    assert not any(x.dtype == jnp.int8 for x in jax.tree.leaves(wide))
    assert any(x.dtype == jnp.int8 for x in jax.tree.leaves(narrow))  # the 64 x 128 MLP weights' codes
    with pytest.raises(ValueError, match="moments='fp8'.*'int8'"):
        models.CausalLMModule(config, moments="fp8")
