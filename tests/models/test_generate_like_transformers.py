"""`Trainer.generate` on models `transformers` made and saved, imported by `fitjax.models`: greedy
generation equals `transformers`' `generate(do_sample=False)` token for token (32 new tokens,
batched prompts of different lengths, left-padded on both sides), with LoRA adapters too, and a
merged export generates what the adapted model does."""

from __future__ import annotations

import jax
import numpy as np
import pytest
import torch
import transformers
from helpers import perturbed_transformers_model, quiet_trainer

import fitjax as fj
from fitjax import models

NEW = 32
PROMPTS = [[5, 17, 3], [9, 2, 44, 61, 7, 7, 30], [12, 80, 1, 33, 2, 9, 41, 8, 15, 70, 3, 90]]
CONFIGS = {
    "gpt2": lambda: transformers.GPT2Config(vocab_size=96, n_positions=64, n_embd=32, n_layer=2, n_head=4),
    "llama": lambda: transformers.LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                              num_attention_heads=4, num_key_value_heads=2,
                                              max_position_embeddings=64),
}


def saved_by_transformers(family: str, folder) -> list[list[int]]:
    """A random model (weights perturbed off their initial values) saved by `transformers`, and
    its greedy continuations of PROMPTS, each up to and including its first end-of-sequence token."""
    model = perturbed_transformers_model(CONFIGS[family]())
    model.save_pretrained(folder)
    width = max(map(len, PROMPTS))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in PROMPTS])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in PROMPTS])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, pad_token_id=0)
    eos = model.config.eos_token_id
    rows = out[:, width:].tolist()
    return [row[:row.index(eos) + 1] if eos in row else row for row in rows]


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_greedy_generation_equals_transformers(family, tmp_path):
    expected = saved_by_transformers(family, tmp_path / "hf")
    assert max(map(len, expected)) == NEW  # at least one row runs the whole way
    trainer = quiet_trainer(strategy="dp")
    module = models.from_pretrained(tmp_path / "hf")
    assert trainer.generate(module, PROMPTS, max_new_tokens=NEW, temperature=0) == expected

    # LoRA: adapters that start at zero generate the base model's tokens; trained (here: drawn)
    # adapters change them, and the merged export generates what the adapted model does
    # the attention and MLP matmuls (qwix's adapter on a tied embedding's `attend` computes other
    # logits under jit than eagerly: not a target here)
    module.apply_lora(r".*(attn|mlp).*", rank=4)
    assert trainer.generate(module, PROMPTS, max_new_tokens=NEW, temperature=0) == expected
    noise = np.random.default_rng(0)
    params = jax.tree_util.tree_map_with_path(
        lambda path, p: p + 0.3 * noise.normal(size=p.shape).astype(p.dtype)
        if "lora" in jax.tree_util.keystr(path) else p, module.variables[0])
    fj.module.set_variables(module, params, module.variables[1])
    adapted = trainer.generate(module, PROMPTS, max_new_tokens=NEW, temperature=0)
    assert adapted != expected
    models.save_pretrained(module, tmp_path / "merged")
    merged = models.from_pretrained(tmp_path / "merged")
    assert trainer.generate(merged, PROMPTS, max_new_tokens=NEW, temperature=0) == adapted
