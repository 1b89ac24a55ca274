"""examples/hf_models.py: a tiny random GPT-2 and Llama 3 made and saved by `transformers` fine-tune
under fitjax (all weights, or LoRA adapters), the loss on held-out text goes down, and the folder
written loads back into `transformers` with nothing missing or unexpected and fitjax's logits.
(Import equality for every family: tests/models/test_pretrained.py.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from helpers import quiet_trainer  # noqa: F401  (first: it puts examples/ on the path)

import hf_models  # noqa: E402,I001

TINY = {
    "gpt2": lambda: transformers.GPT2Config(vocab_size=256, n_positions=64, n_embd=32, n_layer=1, n_head=4),
    "llama": lambda: transformers.LlamaConfig(
        vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 16}),
}


@pytest.mark.parametrize("family, lora", [("gpt2", 0), ("llama", 4)])
def test_a_transformers_folder_fine_tunes_and_goes_back(family, lora, tmp_path):
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(TINY[family]()).save_pretrained(tmp_path / "hf")
    result = hf_models.main(["--model", str(tmp_path / "hf"), "--out", str(tmp_path / "out"), "--steps", "8",
                             "--lr", "1e-2", "--context", "32", "--lora", str(lora), "--strategy", "single"])
    assert result.val_loss_after < result.val_loss_before - 0.1

    back, info = transformers.AutoModelForCausalLM.from_pretrained(result.out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    tokens = np.random.default_rng(0).integers(0, 256, (2, 16)).astype(np.int32)
    ours = np.asarray(result.module(tokens))  # the fine-tuned model (adapters merged in the export)
    with torch.no_grad():
        theirs = back.eval()(torch.from_numpy(tokens).long()).logits.numpy()
    np.testing.assert_allclose(theirs, ours, atol=1e-4, rtol=0)
