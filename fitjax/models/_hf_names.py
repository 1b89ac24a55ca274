"""The one name map between fitjax's arrays and a `transformers` checkpoint's, per architecture.

The map is a function from fitjax's name to Hugging Face's (`layers_0.self_attn.q_proj.kernel`
-> `model.layers.0.self_attn.q_proj.weight`); import reads it backwards over the model's own
arrays (`import_names`), so the two directions cannot disagree. Linear weights are `[out, in]`
in torch and `[in, out]` in flax (transposed both ways, `transposed`); GPT-2's `Conv1D` weights
are already `[in, out]`. `from_pretrained` and `save_pretrained` (`fitjax.models._pretrained`)
read and write folders through it; nothing here reads a file.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp

from fitjax.models._causal_lm import CausalLM
from fitjax.models._config import ModelConfig

__all__ = ["hf_name", "import_names", "local_folder", "param_names", "transposed"]

_LEAVES = {"kernel": "weight", "scale": "weight", "embedding": "weight", "bias": "bias"}
# arrays some `transformers` files hold that are no weights: GPT-2's causal-mask buffers, older
# Llama files' rotary frequencies
_BUFFERS = re.compile(r"(.*\.)?attn\.(masked_)?bias|.*rotary_emb\.inv_freq")


def hf_name(config: ModelConfig, name: str) -> str:
    """The Hugging Face name of fitjax's array `name` (`h_0.attn.c_attn.kernel` ->
    `transformer.h.0.attn.c_attn.weight`). A `scan_layers` model's stacked array
    (`layers.mlp.up_proj.kernel`) is named without the layer (`model.layers.mlp.up_proj.weight`):
    `StackedLayers` names a checkpoint's per-layer arrays so."""
    head, _, leaf = name.rpartition(".")
    head = re.sub(r"^(h|layers)_(\d+)", r"\1.\2", head)
    leaf = _LEAVES.get(leaf, leaf)
    if head == "lm_head":
        return f"lm_head.{leaf}"
    return f"{'transformer' if config.gpt2_layout else 'model'}.{head}.{leaf}"  # the causal LM's prefix


def transposed(config: ModelConfig) -> dict[str, tuple[int, ...] | None]:
    """fitjax's arrays stored transposed in the file: torch `nn.Linear` weights (a stacked
    layer's [layers, in, out] kernel is its layers' [out, in] weights, each transposed)."""
    if config.gpt2_layout:  # Conv1D weights are [in, out] already
        return {r"lm_head\.kernel": None}
    if config.scan_layers:
        return {r"layers\..*_proj\.kernel": (0, 2, 1), r"lm_head\.kernel": None}
    return {r".*_proj\.kernel|lm_head\.kernel": None}


def param_names(model: CausalLM) -> list[str]:
    """fitjax's array names of `model` (from shapes alone: nothing is computed)."""
    shapes = nn.unbox(jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 1), jnp.int32))["params"])
    return [".".join(str(k.key) for k in path) for path, _ in jax.tree_util.tree_flatten_with_path(shapes)[0]]


def import_names(model: CausalLM) -> Callable[[str], str | None]:
    """`load_weights(mapping=...)` for a Hugging Face file of `model`'s architecture: the file's
    name -> fitjax's (`hf_name` read backwards), None for what is no weight of the model."""
    config = model.config
    from_hf = {hf_name(config, name): name for name in param_names(model)}
    base = "transformer." if config.gpt2_layout else "model."

    def rename(name: str) -> str | None:
        # a base model's file (`GPT2Model`: the Hub's own gpt2 weights) names its arrays without
        # the causal LM's prefix
        for candidate in (name, base + name):
            if candidate in from_hf:
                return from_hf[candidate]
        if _BUFFERS.fullmatch(name) or (config.tie_word_embeddings and name == "lm_head.weight"):
            return None  # a buffer, or a tied head: the token table itself
        return name  # unexpected: named in the error

    return rename


_HUB_URL = re.compile(r"(?:https?://)?(?:www\.)?(?:huggingface\.co|hf\.co)/(?:models/)?([\w.-]+/[\w.-]+)")


def local_folder(folder: str | os.PathLike) -> Path:
    """`folder` as a path, once it is a local folder: a Hub name or a URL is answered with how
    to download it (fitjax downloads nothing; `Path` would mangle a URL into `https:/...`)."""
    if not isinstance(folder, (str, os.PathLike)):
        raise TypeError(f"from_pretrained(folder=...) takes a local folder; got {type(folder).__name__}: {folder!r}.")
    text = os.fspath(folder)
    path = Path(text).expanduser()
    if path.is_dir() and "://" not in text:
        return path
    hub = _HUB_URL.match(text)
    name = hub.group(1) if hub else text if re.fullmatch(r"[\w.-]+(/[\w.-]+)?", text) else "NAME"
    what = ("a URL" if "://" in text else "not a folder" if path.exists() else
            "no local folder (a Hugging Face Hub name?)")
    raise ValueError(f"from_pretrained(folder={text!r}): {what}. fitjax reads model folders on local disk and "
                     f"downloads nothing: download it first, e.g. `huggingface-cli download {name} --local-dir "
                     f"{name.rsplit('/', 1)[-1] if name != 'NAME' else 'DIR'}`, then pass that folder.")
