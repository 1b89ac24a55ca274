"""examples/hf_models.py: a tiny random Llama 3 made and saved by `transformers` fine-tunes under
fitjax with LoRA adapters, the loss on held-out text goes down, and the folder written (adapters
merged) loads back into `transformers` with nothing missing or unexpected and fitjax's logits.
(Every family's import and export, without a fit: tests/models/test_pretrained.py.)"""

from __future__ import annotations

import numpy as np
import torch
import transformers
from helpers import quiet_trainer  # noqa: F401  (first: it puts examples/ on the path)

import hf_models  # noqa: E402,I001


def word_tokenizer(folder):
    """A word-level `tokenizer.json` in `folder`: the 255 commonest words of the text, and unknown."""
    import collections
    import json as json_package
    from pathlib import Path

    import tokenizers

    text = " ".join(f.read_text() for f in Path(json_package.__file__).parent.glob("*.py"))
    common = [w for w, _ in collections.Counter(text.split()).most_common(255)]
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel({"[UNK]": 0, **{w: i + 1 for i, w in
                                                                                  enumerate(common)}},
                                                                 unk_token="[UNK]"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(folder / "tokenizer.json"))


def test_a_transformers_folder_fine_tunes_with_lora_and_goes_back(tmp_path):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 16})
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "hf")
    word_tokenizer(tmp_path / "hf")  # the text is cut into the folder's own tokens
    result = hf_models.main(["--model", str(tmp_path / "hf"), "--out", str(tmp_path / "out"), "--steps", "8",
                             "--lr", "1e-2", "--context", "32", "--lora", "4", "--strategy", "single"])
    assert result.val_loss_after < result.val_loss_before - 0.1

    back, info = transformers.AutoModelForCausalLM.from_pretrained(result.out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    tokens = np.random.default_rng(0).integers(0, 256, (2, 16)).astype(np.int32)
    ours = np.asarray(result.module(tokens))  # the adapted model: base and adapters
    with torch.no_grad():
        theirs = back.eval()(torch.from_numpy(tokens).long()).logits.numpy()
    np.testing.assert_allclose(theirs, ours, atol=1e-4, rtol=0)
