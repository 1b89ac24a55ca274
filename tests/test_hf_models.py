"""examples/hf_models.py: a tiny random GPT-2 and Llama made and saved by `transformers` itself load
into fitjax with the same logits, and fitjax's export of other weights loads back into
`transformers` with fitjax's logits."""

from __future__ import annotations

import jax
import numpy as np
import pytest
import torch
import transformers
from helpers import quiet_trainer  # first: it puts examples/ on the path

import hf_models  # noqa: E402,I001

import fitjax as fj

CONFIGS = {
    "gpt2": lambda: transformers.GPT2Config(vocab_size=96, n_positions=32, n_embd=32, n_layer=1, n_head=4,
                                            bos_token_id=0, eos_token_id=0),
    # grouped key/value heads (4 query heads over 2) and an untied head
    "llama": lambda: transformers.LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64,
                                              num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                                              max_position_embeddings=32, rope_theta=500.0,
                                              tie_word_embeddings=False),
}
TOKENS = np.random.default_rng(0).integers(0, 96, (8, 17)).astype(np.int32)


def hf_logits(folder) -> np.ndarray:
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        return model(torch.from_numpy(TOKENS[:, :-1]).long()).logits.numpy()


def logits(module) -> np.ndarray:
    return np.asarray(module.model.apply({"params": module.variables[0]}, TOKENS[:, :-1]))


@pytest.mark.parametrize("arch", sorted(CONFIGS))
def test_a_transformers_model_loads_with_equal_logits_and_its_export_loads_back(arch, tmp_path):
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(CONFIGS[arch]()).save_pretrained(tmp_path / "hf")
    expected = hf_logits(tmp_path / "hf")

    module = hf_models.from_pretrained(tmp_path / "hf")
    strategy = fj.strategies.FSDP(min_size_to_shard=0)  # every array read in slices
    quiet_trainer(strategy=strategy).validate(module, fj.DataLoader({"tokens": TOKENS}, batch_size=8))
    np.testing.assert_allclose(logits(module), expected, atol=1e-4, rtol=0)

    # weights unlike the imported ones (a fine-tune: tests/test_finetune_example.py runs one)
    noise = np.random.default_rng(1)
    params = jax.tree.map(lambda p: p + 0.05 * noise.normal(size=p.shape).astype(p.dtype), module.variables[0])
    fj.module.set_variables(module, params, module.variables[1])
    changed = logits(module)
    assert np.abs(changed - expected).max() > 1e-2
    hf_models.save_pretrained(module, tmp_path / "out")
    np.testing.assert_allclose(hf_logits(tmp_path / "out"), changed, atol=1e-4, rtol=0)
