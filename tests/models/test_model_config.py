"""fitjax.models.ModelConfig reads the `config.json` files on the Hub (written by transformers 4,
`rope_theta` and `rope_scaling` beside the other keys) as it reads the ones transformers 5
writes (`rope_parameters`), and its rotary frequencies are transformers' own."""

from __future__ import annotations

import numpy as np
import pytest
import transformers

from fitjax.models import ModelConfig

SHRUNK = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 7, "vocab_size": 300}
# the files of meta-llama/Llama-3.2-1B, google/gemma-3-1b-it, Qwen/Qwen2.5-0.5B and
# mistralai/Mistral-7B-v0.1 as the Hub serves them, shrunk (the keys that matter kept)
HUB = {
    "llama-3.2": {"architectures": ["LlamaForCausalLM"], "attention_bias": False, "bos_token_id": 128000,
                  "eos_token_id": 128001, "head_dim": 16, "hidden_act": "silu", "max_position_embeddings": 131072,
                  "mlp_bias": False, "model_type": "llama", "num_attention_heads": 4, "num_key_value_heads": 2,
                  "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "tie_word_embeddings": True,
                  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                   "original_max_position_embeddings": 8192, "rope_type": "llama3"}},
    "gemma-3": {"architectures": ["Gemma3ForCausalLM"], "attention_bias": False, "attn_logit_softcapping": None,
                "bos_token_id": 2, "eos_token_id": [1, 106], "final_logit_softcapping": None, "head_dim": 16,
                "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 32768,
                "model_type": "gemma3_text", "num_attention_heads": 4, "num_key_value_heads": 1, "pad_token_id": 0,
                "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000,
                "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "rope_theta": 1000000,
                "sliding_window": 512, "sliding_window_pattern": 6},
    "qwen-2.5": {"architectures": ["Qwen2ForCausalLM"], "bos_token_id": 151643, "eos_token_id": 151643,
                 "hidden_act": "silu", "max_position_embeddings": 32768, "max_window_layers": 24,
                 "model_type": "qwen2", "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
                 "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": True,
                 "use_sliding_window": False},
    "mistral": {"architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
                "max_position_embeddings": 32768, "model_type": "mistral", "num_attention_heads": 4,
                "num_key_value_heads": 2, "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096,
                "tie_word_embeddings": False},
}


@pytest.mark.parametrize("name", sorted(HUB))
def test_a_hub_config_reads_as_transformers_5_rewrites_it(name):
    hub = {**HUB[name], **SHRUNK}
    rewritten = transformers.AutoConfig.for_model(**hub).to_dict()  # what save_pretrained writes today
    assert ModelConfig.from_hf(hub) == ModelConfig.from_hf(rewritten)


@pytest.mark.parametrize("name", sorted(HUB))
def test_rotary_frequencies_are_transformers_own(name):
    config = transformers.AutoConfig.for_model(**{**HUB[name], **SHRUNK})
    model = transformers.AutoModelForCausalLM.from_config(config)
    ours = ModelConfig.from_hf(config.to_dict())
    rotary = model.model.rotary_emb
    for layer_type, rope in ours.rope:
        theirs = getattr(rotary, f"{layer_type}_inv_freq", None)
        theirs = rotary.inv_freq if theirs is None else theirs
        np.testing.assert_allclose(rope.inverse_frequencies(ours.head_dim), theirs.numpy(), rtol=1e-6)
    if name == "gemma-3":  # 5 local layers to a global one; the global layers' rotary scaled
        assert ours.layer_types.count("full_attention") == 1 and ours.layer_types[5] == "full_attention"
        assert dict(ours.rope)["full_attention"].kind == "linear" and dict(ours.rope)["sliding_attention"].theta == 1e4
    if name == "llama-3.2":
        assert dict(ours.rope)["full_attention"].kind == "llama3" and ours.tie_word_embeddings
