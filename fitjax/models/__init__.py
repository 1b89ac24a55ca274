"""The language models people fine-tune, built from a Hugging Face `config.json` and read from
(and written back to) a `transformers` folder: GPT-2, Llama (3.x rotary scaling, biases),
Mistral, Qwen 2.5 and 3, Gemma 2 and 3.

    module = fitjax.models.from_pretrained("path/to/Qwen2.5-0.5B", lr=1e-4)   # a CausalLMModule
    fj.Trainer(max_steps=100, strategy="fsdp").fit(module, data)
    fitjax.models.save_pretrained(module, "out/")   # AutoModelForCausalLM.from_pretrained("out/")

    model = fitjax.models.from_config("path/to/config.json")   # the flax module alone
    logits = model.apply(params, tokens)                        # [batch, length, vocab]
    loss = model.apply(params, tokens, targets=next_tokens)     # chunked: a TokenLoss, no logits kept
    logits, cache = model.apply(params, prompt, cache=model.init_cache(batch, max_length))

Every model's attention is `fitjax.nn.attention` (packed segments, KV cache positions, sliding
windows, soft-capping; the implementation `ModelConfig.attention` names) and its loss
`fitjax.nn.chunked_cross_entropy`, so a platform's fused kernel reaches all of them. Every
parameter carries logical axis names and `LOGICAL_RULES` maps them to `fj.strategies.FSDP`'s mesh
axes: `CausalLMModule` declares them (`logical_axis_rules`), so `FSDP(tensor=2)` splits heads and
MLP units with no rules given. `scan_layers=True` stacks the layers under one `nn.scan` (the KV
cache is stacked [layers, ...] either way); imports and exports map per-layer names both ways.
The GPT example (`examples/gpt.py`) is one of these models, in GPT-2's layout.
"""

from fitjax.models._causal_lm import CausalLM, KVCache, init_cache
from fitjax.models._config import ModelConfig, Rope
from fitjax.models._layers import LOGICAL_RULES
from fitjax.models._hf_names import hf_name
from fitjax.models._pretrained import CausalLMModule, from_config, from_pretrained, save_pretrained

__all__ = ["CausalLM", "CausalLMModule", "KVCache", "LOGICAL_RULES", "ModelConfig", "Rope", "from_config", "from_pretrained", "hf_name", "init_cache", "save_pretrained"]
