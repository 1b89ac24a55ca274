"""fitjax.models: a tiny random model of each family, made and saved by `transformers` itself,
imports with `transformers`' logits (1e-4, float32), and fitjax's export of other weights loads
back into `transformers` with nothing missing or unexpected and fitjax's logits."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest
import torch
import transformers
from helpers import perturbed_transformers_model, quiet_trainer

import fitjax as fj
from fitjax import models

SMALL = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64)
CONFIGS = {
    "gpt2": lambda: transformers.GPT2Config(vocab_size=96, n_positions=32, n_embd=32, n_layer=2, n_head=4),
    # Llama 3.x: rotary scaled by `rope_type="llama3"` (a short original context, so every band of
    # frequencies is changed), attention and MLP biases, an untied head
    "llama3": lambda: transformers.LlamaConfig(
        **SMALL, attention_bias=True, mlp_bias=True, tie_word_embeddings=False,
        rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 16}),
    "mistral": lambda: transformers.MistralConfig(**SMALL, sliding_window=4),
    "qwen2": lambda: transformers.Qwen2Config(**SMALL, tie_word_embeddings=True),  # q/k/v biases
    # QK-norm, a head_dim other than hidden / heads, a sliding layer after a full one
    "qwen3": lambda: transformers.Qwen3Config(**SMALL, head_dim=16, use_sliding_window=True, sliding_window=4,
                                              max_window_layers=1),
    "gemma2": lambda: transformers.Gemma2Config(**SMALL, head_dim=16, sliding_window=4, query_pre_attn_scalar=24,
                                                attn_logit_softcapping=2.0, final_logit_softcapping=3.0),
    # local layers' own rotary base, linear scaling on the global ones, QK-norm
    "gemma3": lambda: transformers.Gemma3TextConfig(
        **SMALL, head_dim=16, sliding_window=4, query_pre_attn_scalar=24, final_logit_softcapping=3.0,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                         "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}}),
}
TOKENS = np.random.default_rng(0).integers(0, 96, (8, 17)).astype(np.int32)


def hf_logits(model) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(TOKENS[:, :-1]).long()).logits.numpy()


def logits(module, apply) -> np.ndarray:
    """The module's logits on TOKENS by `apply`, its model's `apply` jitted (eagerly each op
    compiles on its own: slower than the whole program, and one program serves new weights)."""
    return np.asarray(apply({"params": module.variables[0]}, TOKENS[:, :-1]))


def saved_by_transformers(family, folder):
    """A random model of `family` with every weight perturbed (biases and Gemma's norms start at
    zero), saved by `transformers`; its logits on TOKENS."""
    model = perturbed_transformers_model(CONFIGS[family]())
    model.save_pretrained(folder)
    return hf_logits(model)


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_a_transformers_model_imports_with_equal_logits_and_exports_back(family, tmp_path):
    expected = saved_by_transformers(family, tmp_path / "hf")

    module = models.from_pretrained(tmp_path / "hf")
    strategy = fj.strategies.FSDP(min_size_to_shard=0)  # every array read in slices, transposed ones too
    quiet_trainer(strategy=strategy).validate(module, fj.DataLoader({"tokens": TOKENS}, batch_size=8), verbose=False)
    apply = jax.jit(module.model.apply)
    np.testing.assert_allclose(logits(module, apply), expected, atol=1e-4, rtol=0)

    noise = np.random.default_rng(1)  # weights unlike the imported ones: a fine-tune's
    params = jax.tree.map(lambda p: p + 0.05 * noise.normal(size=p.shape).astype(p.dtype), module.variables[0])
    fj.module.set_variables(module, params, module.variables[1])
    changed = logits(module, apply)
    assert np.abs(changed - expected).max() > 1e-2
    models.save_pretrained(module, tmp_path / "out")
    back, info = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert type(back).__name__ == json.loads((tmp_path / "hf" / "config.json").read_text())["architectures"][0]
    np.testing.assert_allclose(hf_logits(back.eval()), changed, atol=1e-4, rtol=0)


def test_greedy_generation_of_an_imported_gemma2_equals_transformers(tmp_path):
    """Sliding windows shorter than the text, soft-capping and left-padded prompts of different
    lengths through the KV cache: `Trainer.generate` picks transformers' tokens. (GPT-2 and
    Llama: tests/loop/test_generation.py.)"""
    config = CONFIGS["gemma2"]()
    config.eos_token_id = config.bos_token_id = None  # random weights: run all 12 tokens
    config.tie_word_embeddings = False  # tied, a random Gemma repeats its last token: windows unseen
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5 * torch.randn_like(p))
    model.save_pretrained(tmp_path / "hf")
    prompts = [[5, 6, 7, 8, 9], [10, 11, 12]]
    padded = torch.tensor([prompts[0], [0, 0, *prompts[1]]])
    theirs = model.generate(padded, attention_mask=(padded > 0).long(), do_sample=False, max_new_tokens=12,
                            pad_token_id=0)[:, 5:].tolist()

    module = models.from_pretrained(tmp_path / "hf")
    ours = quiet_trainer(strategy="single").generate(module, prompts, max_new_tokens=12, temperature=0)
    assert [list(map(int, row)) for row in ours] == theirs


def test_a_base_model_file_without_the_causal_lm_prefix_imports(tmp_path):
    """The Hub's own GPT-2 weights are a `GPT2Model`'s (`h.0.attn.c_attn.weight`, no
    `transformer.`): they import, the tied head being the token table."""
    torch.manual_seed(0)
    transformers.GPT2Model(CONFIGS["gpt2"]()).save_pretrained(tmp_path / "base")
    expected = hf_logits(transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base").eval())
    module = models.from_pretrained(tmp_path / "base")
    quiet_trainer(strategy="single").validate(module, fj.DataLoader({"tokens": TOKENS}, batch_size=8), verbose=False)
    np.testing.assert_allclose(logits(module, jax.jit(module.model.apply)), expected, atol=1e-4, rtol=0)
