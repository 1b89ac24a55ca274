"""`CausalLMModule`, the training module of a `CausalLM`, and Hugging Face folders in and out:
`from_config`, `from_pretrained`, `save_pretrained`. The name map between fitjax's arrays and a
`transformers` checkpoint's is `fitjax.models._hf_names`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fitjax.data import packing_efficiency
from fitjax.models._batches import as_lm_batch
from fitjax.models._causal_lm import CausalLM
from fitjax.models._config import ModelConfig, read_config
from fitjax.models._hf_names import hf_name, import_names, local_folder, transposed
from fitjax.models._layers import LOGICAL_RULES
from fitjax.models._stacked import StackedLayers, unstacked
from fitjax.module import LitModule
from fitjax.optim import adamw
from fitjax.module import export_arrays, open_weight_source, save_safetensors, weights_to_save

__all__ = ["CausalLMModule", "from_config", "from_pretrained", "save_pretrained"]


def from_config(config: Mapping[str, Any] | str | os.PathLike, **options: Any) -> CausalLM:
    """The `CausalLM` a Hugging Face `config.json` describes (a dict, the file or its folder),
    with no weights: `model.init` makes random ones, `from_pretrained` reads the folder's.
    `options` are fitjax's switches of `ModelConfig` (`scan_layers=True`, `attention="xla"`).

    Raises:
        ValueError: for an architecture fitjax does not read, naming what it lacks.

    Example:
        >>> from fitjax.models import from_config
        >>> model = from_config({"model_type": "gpt2", "vocab_size": 100, "n_embd": 32, "n_layer": 2,
        ...                      "n_head": 4, "n_positions": 64})
        >>> model.config.vocab_size, model.config.max_position_embeddings
        (100, 64)
    """
    return CausalLM(ModelConfig.from_hf(config, **options))


class CausalLMModule(LitModule):
    """Next-token prediction with a `CausalLM`: `batch["tokens"]` int [batch, length + 1]; with
    `batch["segment_ids"]` (same shape; packed documents, 0 for padding) no token attends across
    documents and only targets in their input's document count (a token-weighted loss), and
    `batch["positions"]` gives each document's own positions. A batch of `fj.data.TextLoader`
    (`tokens`, `targets`, `loss_mask`, `segment_ids`, `positions`, all [batch, length]) is
    trained as it comes: the loss is over the targets `loss_mask` marks (prompts masked with
    `completion_only`), weighted by tokens, and `train/packing_efficiency` is logged. A Hugging
    Face batch (`input_ids`, optional `attention_mask` and `labels`, -100 for no loss: what
    `transformers`' and TRL's collators make) is trained as the same thing; any other batch is
    refused at the first step, naming the keys taken (`fitjax.models._batches`).

    The loss is `fj.nn.chunked_cross_entropy` (`CausalLM(targets=...)`): the output layer and its
    softmax `loss_chunk` positions at a time, never the whole float32 logits [batch, length,
    vocab]. The model's parameters carry logical axis names and the module exposes their rules
    (`logical_axis_rules`, `fitjax.models.LOGICAL_RULES`), which `fj.strategies.FSDP` uses when it
    is given none: `FSDP(tensor=2)` splits heads and MLP units with no other code.

    Args:
        config: the Hugging Face `config.json` (a dict, the file or its folder).
        lr: AdamW's learning rate.
        scan_layers: the layers as one `nn.scan` over stacked parameters (`ModelConfig.scan_layers`):
            compile time independent of depth; imports and exports map to per-layer names.
        attention: `fitjax.nn.attention`'s implementation ("auto", "xla", "pallas", "cudnn").
        loss_chunk: positions per chunk of the loss.
        moments: how AdamW stores its two moments between steps (`fj.optim.adamw(moments=...)`):
            "float32" (optax's AdamW itself, 8 bytes a parameter), "bfloat16" (4) or "int8"
            (block-wise 8-bit, ~2: bitsandbytes' AdamW8bit), for models that fill the chip.

    Example:
        >>> from fitjax.models import CausalLMModule
        >>> module = CausalLMModule({"model_type": "llama", "vocab_size": 64, "hidden_size": 32,
        ...                          "intermediate_size": 64, "num_hidden_layers": 1,
        ...                          "num_attention_heads": 4}, lr=1e-3)
        >>> module.model.config.num_kv_heads
        4
        >>> # fj.Trainer(max_steps=100).fit(module, fj.DataLoader({"tokens": tokens}, batch_size=8))
    """

    #: the model's logical axis names -> mesh axes, for `fj.strategies.FSDP` given no rules of its own
    logical_axis_rules = LOGICAL_RULES

    def __init__(self, config: Mapping[str, Any] | str | os.PathLike, lr: float = 1e-3, *,
                 scan_layers: bool = False, attention: str = "auto", loss_chunk: int = 256,
                 moments: str = "float32"):
        super().__init__()
        adamw(lr, moments=moments)  # a bad `moments` refused here, naming the choices
        self.save_hyperparameters()
        self.model = CausalLM(ModelConfig.from_hf(config, scan_layers=scan_layers, attention=attention))

    def loss(self, model, batch):
        batch = as_lm_batch(batch, owner=type(self).__name__)  # Hugging Face's keys as fitjax's
        chunk = self.hparams.loss_chunk
        if "targets" in batch:  # fj.data.TextLoader's rows: the next tokens and which of them count
            return model(batch["tokens"], positions=batch["positions"], segment_ids=batch["segment_ids"],
                         targets=batch["targets"], loss_mask=batch["loss_mask"], loss_chunk=chunk)
        tokens = batch["tokens"]
        segments = batch.get("segment_ids")
        inputs = {"segment_ids": None if segments is None else segments[:, :-1]}
        if "positions" in batch:
            inputs["positions"] = batch["positions"][:, :-1]
        if segments is None:
            return model(tokens[:, :-1], targets=tokens[:, 1:], loss_chunk=chunk, **inputs).mean
        counted = (segments[:, 1:] == segments[:, :-1]) & (segments[:, 1:] != 0)
        return model(tokens[:, :-1], targets=tokens[:, 1:], loss_mask=counted, loss_chunk=chunk, **inputs)

    def metrics(self, batch, outputs):
        if "segment_ids" in batch and "targets" in batch:
            return {"packing_efficiency": packing_efficiency(batch)}
        return {}

    def configure_optimizer(self):
        return adamw(self.hparams.lr, moments=self.hparams.get("moments", "float32"))  # older saves lack it


def from_pretrained(folder: str | os.PathLike, **kwargs: Any) -> CausalLMModule:
    """A `CausalLMModule` holding the weights of a folder `save_pretrained` wrote (`config.json`
    and `model.safetensors`, or shards listed in `model.safetensors.index.json`), read when a
    trainer builds the state, each array into the strategy's sharding.

    Args:
        folder: the Hugging Face model folder.
        **kwargs: `CausalLMModule`'s other arguments (`lr`, `scan_layers`, `attention`, ...):
            with `scan_layers=True` each of the file's per-layer arrays is read into its slice
            of the stacked one.

    Example:
        >>> # module = fitjax.models.from_pretrained("path/to/Llama-3.2-1B", lr=1e-4)
        >>> # fj.Trainer(max_steps=100, strategy="fsdp").fit(module, data)
    """
    folder = local_folder(folder)
    module = CausalLMModule(read_config(folder), **kwargs)
    config = module.model.config
    source = open_weight_source(folder, argument="from_pretrained(folder)")
    if config.scan_layers:  # the file's `model.layers.<i>.*` seen as one `model.layers.*` [layers, ...]
        source = StackedLayers(source, config.num_layers)
    module.load_weights(source, mapping=import_names(module.model), transpose=transposed(config))
    return module


def save_pretrained(module: CausalLMModule, folder: str | os.PathLike, *, dtype: Any = None) -> None:
    """Writes `config.json` and `model.safetensors` that `transformers`'
    `AutoModelForCausalLM.from_pretrained` loads: the trained weights (LoRA adapters merged in)
    under Hugging Face's names and layouts.

    Args:
        module: a `CausalLMModule` after a fit (or a restore).
        folder: created if needed; only process 0 writes.
        dtype: floats written in this dtype (`jnp.bfloat16`); None keeps the weights' own.

    Example:
        >>> # fitjax.models.save_pretrained(module, "out/")
        >>> # transformers.AutoModelForCausalLM.from_pretrained("out/")
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = module.model.config
    if config.scan_layers:  # written per layer, as transformers reads them: the unrolled model's names
        unrolled = dataclasses.replace(config, scan_layers=False)
        if module.variables is None:
            raise ValueError(f"save_pretrained(module, {str(folder)!r}): the module has no weights yet; fit it, or "
                             "restore it, first.")
        arrays = export_arrays(unstacked(weights_to_save(module), config), mapping=lambda name: hf_name(unrolled, name),
                               transpose=transposed(unrolled), dtype=dtype, owner=type(module).__name__)
        if jax.process_index() == 0:
            save_safetensors(arrays, folder / "model.safetensors", {"format": "pt"})
    else:
        module.save_weights(folder / "model.safetensors", mapping=lambda name: hf_name(config, name),
                            transpose=transposed(config), dtype=dtype, metadata={"format": "pt"})
    if jax.process_index() == 0:
        out = config.to_hf()
        floats = ({np.dtype(dtype).name} if dtype is not None else
                  {np.dtype(leaf.dtype).name for leaf in jax.tree.leaves(module.variables[0])
                   if jnp.issubdtype(leaf.dtype, jnp.floating)})
        if len(floats) == 1:  # the dtype transformers loads the weights in
            out["dtype"] = floats.pop()
            out.pop("torch_dtype", None)
        (folder / "config.json").write_text(json.dumps(out, indent=2))
