"""`ModelConfig`: one causal language model's architecture, read from a Hugging Face
`config.json` (and written back as that file).

Every family fitjax reads is the same decoder with a few switches: how positions enter (learned
table or rotary), which norm (LayerNorm, RMSNorm, Gemma's RMSNorm scaled by 1 + w), where the
biases are, whether queries and keys are normalised per head, which layers see a sliding window,
and Gemma's soft-capped logits. Each family's reader sets the switches from its own keys, with
the defaults `transformers` applies when a key is absent; a key whose value fitjax does not
implement raises, naming it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

import numpy as np

__all__ = ["ModelConfig", "Rope", "check_config", "read_config"]

FULL, SLIDING = "full_attention", "sliding_attention"
ROPE_TYPES = ("default", "linear", "llama3")


@dataclasses.dataclass(frozen=True)
class Rope:
    """Rotary positions: the base `theta` and a scaling (`kind`: "default", "linear" or
    "llama3", with `transformers`' parameters of that name)."""

    theta: float
    kind: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def inverse_frequencies(self, head_dim: int) -> np.ndarray:
        """float32 [head_dim // 2], as `transformers` computes them (in float32, so the logits
        agree to float32 rounding)."""
        exponents = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
        inv = (np.float32(1.0) / np.power(np.float32(self.theta), exponents)).astype(np.float32)
        if self.kind == "linear":
            return (inv / np.float32(self.factor)).astype(np.float32)
        if self.kind == "llama3":
            # Llama 3.1's smooth interpolation: long wavelengths slowed by `factor`, short ones
            # kept, the band between them blended
            old = self.original_max_position_embeddings
            low_wavelen, high_wavelen = old / self.low_freq_factor, old / self.high_freq_factor
            wavelen = np.float32(2 * math.pi) / inv
            scaled = np.where(wavelen > low_wavelen, inv / np.float32(self.factor), inv)
            smooth = (old / wavelen - self.low_freq_factor) / (self.high_freq_factor - self.low_freq_factor)
            smoothed = (1 - smooth) * scaled / np.float32(self.factor) + smooth * scaled
            medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
            return np.where(medium, smoothed, scaled).astype(np.float32)
        return inv


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """A causal LM's architecture (hashable: a Linen module's attribute).

    Attributes:
        model_type: the `config.json`'s `model_type` ("gpt2", "llama", "mistral", "qwen2",
            "qwen3", "gemma2", "gemma3_text").
        vocab_size: the number of tokens.
        hidden_size: the residual stream's width.
        num_layers: decoder layers.
        num_heads: query heads (`num_kv_heads` fewer: grouped-query attention).
        num_kv_heads: key and value heads.
        head_dim: each head's width.
        intermediate_size: the MLP's inner width.
        max_position_embeddings: the longest sequence the model was trained for (GPT-2's
            position table's size).
        bos_token_id, eos_token_id, pad_token_id: as in the file (`eos_token_id` may be a
            tuple: Llama 3 instruct models stop at any of several).
        layer_types: per layer, "full_attention" or "sliding_attention".
        sliding_window: the window of the sliding layers (a query at p sees keys above p - window).
        rope: per layer type, the rotary positions (None: GPT-2's learned positions).

    fitjax's own switches follow (no `config.json` key: `from_hf(config, **options)` and
    `CausalLMModule`'s arguments set them; `to_hf` leaves them out):

        scan_layers: the decoder layers run as one `nn.scan` over parameters stacked on a
            leading "layers" axis (`layers.self_attn.q_proj.kernel` [layers, in, out]): XLA
            compiles one layer, not `num_layers` copies (MaxText's `scan_layers`). The KV cache
            is the same either way. Needs every layer alike (one `layer_types` entry).
        attention: `fitjax.nn.attention`'s implementation for training and evaluation ("auto",
            "xla", "pallas", "cudnn"); generation's one-token steps take "auto".
        norm_bias: LayerNorm's bias (GPT-2's layout); False: a scale only.
        fused_qkv: GPT-2's layout: one `c_attn` [hidden, 3 x hidden]; False: `q_proj`,
            `k_proj`, `v_proj` (a layout no `transformers` file holds: the GPT example's, whose
            heads `FSDP(tensor=...)` splits).
        init_std: the initial weights drawn from normal(`init_std`) (Hugging Face's
            `initializer_range`), biases 0, norms 1; None: Flax's defaults.
        position_init_std: with `init_std`, the learned position table's own (None: `init_std`).
        scale_residual_init: GPT-2's: the projections that write to the residual stream
            (`o_proj`/`c_proj`, `down_proj`/`mlp.c_proj`) drawn with `init_std / sqrt(2 x num_layers)`.
    """

    model_type: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    max_position_embeddings: int
    norm_eps: float
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    pad_token_id: int | None = None
    norm: Literal["layer", "rms", "rms_plus_one"] = "rms"  # Gemma scales by (1 + w), w starting at 0
    activation: str = "silu"
    qkv_bias: bool = False
    out_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False  # Qwen 3, Gemma 3: each head's query and key normalised before rotary
    sandwich_norm: bool = False  # Gemma 2/3: norms after attention and around the MLP as well
    embed_scale: float | None = None  # Gemma: token embeddings times sqrt(hidden_size)
    attention_scale: float | None = None  # None: 1 / sqrt(head_dim)
    attn_softcap: float | None = None
    final_softcap: float | None = None
    tie_word_embeddings: bool = False
    layer_types: tuple[str, ...] = ()
    sliding_window: int | None = None
    rope: tuple[tuple[str, Rope], ...] = ()  # ((layer type, Rope), ...)
    source: str = dataclasses.field(default="{}", compare=False, repr=False)  # the config.json read
    scan_layers: bool = False
    attention: str = "auto"
    norm_bias: bool = True
    fused_qkv: bool = True
    init_std: float | None = None
    position_init_std: float | None = None
    scale_residual_init: bool = False

    def __post_init__(self) -> None:
        if self.scan_layers and len(set(self.layer_types)) > 1:
            raise ValueError(
                f"ModelConfig(scan_layers=True) runs every layer as one, but this {self.model_type!r} model's layers "
                f"differ (layer_types {sorted(set(self.layer_types))}: sliding-window and full-attention layers); "
                "use scan_layers=False for it.")
        if not isinstance(self.attention, str):
            raise TypeError(f"ModelConfig(attention={self.attention!r}) names fitjax.nn.attention's implementation: "
                            "'auto', 'xla', 'pallas' or 'cudnn'.")

    @property
    def gpt2_layout(self) -> bool:
        """GPT-2's layout: a fused `c_attn`, a `c_fc`/`c_proj` MLP (not gated), learned positions."""
        return self.model_type == "gpt2"

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """The end-of-sequence ids as a tuple (empty when the file names none)."""
        eos = self.eos_token_id
        return () if eos is None else (eos,) if isinstance(eos, int) else tuple(eos)

    def rope_for(self, layer: int) -> Rope | None:
        """The rotary positions of layer `layer` (None for learned positions)."""
        return dict(self.rope).get(self.layer_types[layer])

    def window_for(self, layer: int) -> int | None:
        return self.sliding_window if self.layer_types[layer] == SLIDING else None

    def to_hf(self) -> dict[str, Any]:
        """The `config.json` this model reads back from (the file it was read from)."""
        config = json.loads(self.source)
        config.setdefault("architectures", [ARCHITECTURES[self.model_type]])
        return config

    @classmethod
    def from_hf(cls, config: Mapping[str, Any] | str | os.PathLike, **options: Any) -> "ModelConfig":
        """The architecture of a Hugging Face `config.json` (a dict, the file, or its folder),
        with fitjax's own switches `options` (`scan_layers=True`, `attention="xla"`, ...).

        Raises:
            ValueError: for a `model_type` fitjax does not read, or a setting it does not
                implement (named, with what is read).

        Example:
            >>> from fitjax.models import ModelConfig
            >>> c = ModelConfig.from_hf({"model_type": "llama", "vocab_size": 128, "hidden_size": 64,
            ...                          "intermediate_size": 128, "num_hidden_layers": 2,
            ...                          "num_attention_heads": 4, "num_key_value_heads": 2})
            >>> c.head_dim, c.num_kv_heads, c.tie_word_embeddings
            (16, 2, False)
        """
        config = read_config(config)
        kind = config.get("model_type")
        if kind == "gemma3" and isinstance(config.get("text_config"), Mapping):
            raise ValueError("config.json has model_type='gemma3' (Gemma 3's image-and-text model, "
                             "Gemma3ForConditionalGeneration); fitjax.models reads its text model, model_type "
                             "'gemma3_text' (Gemma3ForCausalLM): save the language model alone, e.g. "
                             "`Gemma3ForCausalLM.from_pretrained(folder).save_pretrained(out)` with transformers.")
        if kind not in _READERS:
            raise ValueError(f"config.json has model_type={kind!r}; fitjax.models reads {sorted(_READERS)}. "
                             "Other architectures need their own blocks: a flax model of your own with "
                             "`LitModule.load_weights(folder, mapping=...)` reads their weights.")
        fields = _check_heads(_READERS[kind](_Reader(config, kind)), kind)
        fields.setdefault("layer_types", (FULL,) * fields["num_layers"])
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise TypeError(f"ModelConfig.from_hf(..., {unknown[0]}=...): not one of fitjax's switches {list(OPTIONS)}.")
        return cls(model_type=kind, source=json.dumps(dict(config)), **_tokens(config), **fields, **options)


def read_config(config: Mapping[str, Any] | str | os.PathLike) -> dict[str, Any]:
    """The dict of a `config.json` given as a dict, the file, or the folder holding it, its
    sizes checked (`check_config`)."""
    if isinstance(config, Mapping):
        return check_config(dict(config), "the config")
    if not isinstance(config, (str, os.PathLike)):
        raise TypeError(f"config must be a dict, a config.json file or a folder holding one; got {config!r}.")
    path = Path(config).expanduser()
    path = path / "config.json" if path.is_dir() else path
    if not path.is_file():
        raise ValueError(f"config={str(config)!r}: no such config.json; pass a Hugging Face model folder, its "
                         "config.json, or the config as a dict. fitjax reads local files and downloads nothing: "
                         "`huggingface-cli download NAME --local-dir DIR` fetches a Hub model's folder.")
    try:
        loaded = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as error:  # JSONDecodeError is a ValueError
        raise ValueError(f"{str(path)!r} is not valid JSON ({error}): cut by a download or copy that did not "
                         "finish, or an edit? Download it again or fix it.") from None
    if not isinstance(loaded, dict):
        raise ValueError(f"{str(path)!r} holds a JSON {type(loaded).__name__}, not an object of settings: not a "
                         "Hugging Face config.json.")
    return check_config(loaded, repr(str(path)))


# ------------------------------------------------------------------ the reader's value checks

# sizes every family reads under one of these names: an int of at least 1 when given (None, or
# absent, takes the family's default)
_SIZES = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
          "num_key_value_heads", "head_dim", "max_position_embeddings", "sliding_window",
          "sliding_window_pattern", "n_embd", "n_layer", "n_head", "n_inner", "n_positions")
_POSITIVE = ("rms_norm_eps", "layer_norm_epsilon", "rope_theta", "rope_local_base_freq", "query_pre_attn_scalar")


def check_config(config: dict[str, Any], where: str) -> dict[str, Any]:
    """`config` itself once its sizes are sound: each an int of at least 1 (not `"32"`, not 0,
    not -1), the epsilons and rotary bases numbers above 0, key/value heads dividing the query
    heads, and the width dividing into heads when no `head_dim` is given. Raises `ValueError`
    naming `where` (the file) and the key: a bad value fails here, not later inside JAX."""
    for key in _SIZES:
        value = config.get(key)
        if value is not None and (type(value) is not int or value < 1):
            fix = f"; write {value.strip()} without quotes" if isinstance(value, str) and value.strip().isdigit() else ""
            raise ValueError(f"{where} has {key}={value!r} ({type(value).__name__}); it must be an int of at least 1"
                             f"{fix}.")
    for key in _POSITIVE:
        value = config.get(key)
        if value is not None and (type(value) not in (int, float) or not value > 0):
            raise ValueError(f"{where} has {key}={value!r} ({type(value).__name__}); it must be a number above 0.")
    heads = config.get("num_attention_heads") or config.get("n_head")
    kv_heads = config.get("num_key_value_heads")
    if heads and kv_heads and heads % kv_heads:
        raise ValueError(f"{where} has num_key_value_heads={kv_heads!r}, which does not divide "
                         f"num_attention_heads={heads!r}: each key/value head serves a whole group of query heads. "
                         "Fix one of the two.")
    width = config.get("hidden_size") or config.get("n_embd")
    if heads and width and not config.get("head_dim") and width % heads:
        key = "hidden_size" if config.get("hidden_size") else "n_embd"
        raise ValueError(f"{where} has {key}={width!r}, which does not divide into num_attention_heads={heads!r} "
                         "heads, and no head_dim. Fix one of them, or give head_dim.")
    return config


def _check_heads(fields: dict[str, Any], kind: str) -> dict[str, Any]:
    """`fields` once the key/value heads (the family's default where the file gives none)
    divide the query heads."""
    if fields["num_heads"] % fields["num_kv_heads"]:
        raise ValueError(f"config.json of model_type={kind!r} has num_attention_heads={fields['num_heads']!r} and "
                         f"no num_key_value_heads; {kind}'s default, {fields['num_kv_heads']}, does not divide them. "
                         "Give num_key_value_heads.")
    return fields


#: ModelConfig's fields that no config.json holds (fitjax's own switches)
OPTIONS = ("scan_layers", "attention", "norm_bias", "fused_qkv", "init_std", "position_init_std",
           "scale_residual_init")

ARCHITECTURES = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                 "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "gemma2": "Gemma2ForCausalLM",
                 "gemma3_text": "Gemma3ForCausalLM"}


class _Reader:
    """`config[key]` with the family's default, and errors naming the key."""

    def __init__(self, config: Mapping[str, Any], kind: str):
        self.config, self.kind = config, kind

    def __call__(self, key: str, default: Any = ...) -> Any:
        value = self.config.get(key)
        if value is None:
            if default is ...:
                raise ValueError(f"config.json of model_type={self.kind!r} lacks {key!r}, which fitjax.models needs.")
            return default
        return value

    def refuse(self, key: str, value: Any, reads: str) -> None:
        raise ValueError(f"config.json of model_type={self.kind!r} has {key}={value!r}, which fitjax.models does "
                         f"not implement (it reads {reads}).")

    def rope(self, layer_type: str | None = None, *, theta: float = 10000.0) -> Rope:
        """`rope_parameters` (transformers 5; nested by layer type for Gemma 3) or the older
        `rope_theta` with `rope_scaling`."""
        params = self.config.get("rope_parameters") or self.config.get("rope_scaling") or {}
        if layer_type is not None and isinstance(params.get(layer_type), Mapping):
            params = params[layer_type]
        elif layer_type is not None and any(isinstance(v, Mapping) for v in params.values()):
            params = {}
        kind = params.get("rope_type", params.get("type", "default"))
        if kind not in ROPE_TYPES:
            self.refuse("rope_type", kind, f"rotary scalings {list(ROPE_TYPES)}")
        theta = params.get("rope_theta", self.config.get("rope_theta", theta))
        if params.get("partial_rotary_factor", 1.0) != 1.0:
            self.refuse("partial_rotary_factor", params["partial_rotary_factor"], "rotary over the whole head, 1.0")
        if kind == "default":
            return Rope(float(theta))
        if kind == "linear":
            return Rope(float(theta), kind, float(params["factor"]))
        return Rope(float(theta), kind, float(params["factor"]), float(params["low_freq_factor"]),
                    float(params["high_freq_factor"]),
                    int(params.get("original_max_position_embeddings") or self("max_position_embeddings")))


def _tokens(config: Mapping[str, Any]) -> dict[str, Any]:
    eos = config.get("eos_token_id")
    return {"bos_token_id": config.get("bos_token_id"), "pad_token_id": config.get("pad_token_id"),
            "eos_token_id": tuple(eos) if isinstance(eos, list) else eos}


_ACTIVATIONS = ("silu", "gelu", "gelu_new", "gelu_pytorch_tanh", "relu")


def _activation(read: _Reader, key: str, default: str) -> str:
    act = read(key, default)
    if act not in _ACTIVATIONS:
        read.refuse(key, act, f"activations {list(_ACTIVATIONS)}")
    return act


def _shapes(read: _Reader, *, max_positions: int, head_dim: bool = True, kv_heads: int | None = None) -> dict:
    heads, width = read("num_attention_heads"), read("hidden_size")
    return {"vocab_size": read("vocab_size"), "hidden_size": width, "num_layers": read("num_hidden_layers"),
            "num_heads": heads, "num_kv_heads": read("num_key_value_heads", kv_heads or heads),
            "head_dim": (read("head_dim", None) if head_dim else None) or width // heads,
            "intermediate_size": read("intermediate_size"),
            "max_position_embeddings": read("max_position_embeddings", max_positions),
            "norm_eps": float(read("rms_norm_eps", 1e-6))}


def _gpt2(read: _Reader) -> dict[str, Any]:
    for key, fine in (("scale_attn_by_inverse_layer_idx", False), ("reorder_and_upcast_attn", False),
                      ("add_cross_attention", False)):
        if read(key, fine) != fine:
            read.refuse(key, read(key), f"GPT2LMHeadModel's defaults, {key}={fine!r}")
    width, heads = read("n_embd", 768), read("n_head", 12)
    return {"vocab_size": read("vocab_size", 50257), "hidden_size": width, "num_layers": read("n_layer", 12),
            "num_heads": heads, "num_kv_heads": heads, "head_dim": width // heads,
            "intermediate_size": read("n_inner", 4 * width), "max_position_embeddings": read("n_positions", 1024),
            "norm_eps": float(read("layer_norm_epsilon", 1e-5)), "norm": "layer",
            "activation": _activation(read, "activation_function", "gelu_new"),
            "qkv_bias": True, "out_bias": True, "mlp_bias": True,
            "attention_scale": None if read("scale_attn_weights", True) else 1.0,
            "tie_word_embeddings": read("tie_word_embeddings", True)}


def _llama(read: _Reader) -> dict[str, Any]:
    bias = bool(read("attention_bias", False))
    return {**_shapes(read, max_positions=2048), "activation": _activation(read, "hidden_act", "silu"),
            "qkv_bias": bias, "out_bias": bias, "mlp_bias": bool(read("mlp_bias", False)),
            "tie_word_embeddings": read("tie_word_embeddings", False), "rope": ((FULL, read.rope()),)}


def _mistral(read: _Reader) -> dict[str, Any]:
    window = read("sliding_window", None)  # every layer slides when set
    return {**_shapes(read, max_positions=131072, kv_heads=8), "activation": _activation(read, "hidden_act", "silu"),
            "tie_word_embeddings": read("tie_word_embeddings", False),
            "layer_types": (FULL if window is None else SLIDING,) * read("num_hidden_layers"),
            "sliding_window": window, "rope": ((FULL, read.rope()), (SLIDING, read.rope()))}


def _qwen_layers(read: _Reader) -> dict[str, Any]:
    """Qwen's sliding window: only with `use_sliding_window`, on layers from `max_window_layers` on."""
    window = read("sliding_window", None) if read("use_sliding_window", False) else None
    layers = read("num_hidden_layers")
    types = read("layer_types", None) or [SLIDING if window is not None and i >= read("max_window_layers", 28)
                                          else FULL for i in range(layers)]
    return {"layer_types": _layer_types(read, types), "sliding_window": window,
            "rope": ((FULL, read.rope()), (SLIDING, read.rope()))}


def _qwen2(read: _Reader) -> dict[str, Any]:
    return {**_shapes(read, max_positions=32768, head_dim=False), **_qwen_layers(read),
            "activation": _activation(read, "hidden_act", "silu"), "qkv_bias": True,
            "tie_word_embeddings": read("tie_word_embeddings", False)}


def _qwen3(read: _Reader) -> dict[str, Any]:
    bias = bool(read("attention_bias", False))
    return {**_shapes(read, max_positions=32768), **_qwen_layers(read), "qk_norm": True,
            "activation": _activation(read, "hidden_act", "silu"), "qkv_bias": bias, "out_bias": bias,
            "tie_word_embeddings": read("tie_word_embeddings", False)}


def _gemma(read: _Reader, *, every: int, max_positions: int, vocab: int) -> dict[str, Any]:
    if read("use_bidirectional_attention", False):
        read.refuse("use_bidirectional_attention", True, "causal attention")
    layers, width = read("num_hidden_layers"), read("hidden_size")
    types = read("layer_types", None) or [SLIDING if (i + 1) % every else FULL for i in range(layers)]
    bias = bool(read("attention_bias", False))
    shapes = {**_shapes(read, max_positions=max_positions, kv_heads=4), "vocab_size": read("vocab_size", vocab)}
    return {**shapes, "norm": "rms_plus_one", "activation": _activation(read, "hidden_activation", "gelu_pytorch_tanh"),
            "qkv_bias": bias, "out_bias": bias, "sandwich_norm": True, "embed_scale": float(width) ** 0.5,
            "attention_scale": float(read("query_pre_attn_scalar", 256)) ** -0.5,
            "tie_word_embeddings": read("tie_word_embeddings", True), "layer_types": _layer_types(read, types),
            "sliding_window": read("sliding_window", 4096)}


def _gemma2(read: _Reader) -> dict[str, Any]:
    return {**_gemma(read, every=2, max_positions=8192, vocab=256000),
            "attn_softcap": read("attn_logit_softcapping", None), "final_softcap": read("final_logit_softcapping", None),
            "rope": ((FULL, read.rope()), (SLIDING, read.rope()))}


def _gemma3(read: _Reader) -> dict[str, Any]:
    # transformers' Gemma 3 takes no attention soft-capping (`attn_logit_softcapping` is read and
    # not applied): fitjax follows it, so the logits agree
    local = read("rope_local_base_freq", 10000.0)
    return {**_gemma(read, every=read("sliding_window_pattern", 6), max_positions=131072, vocab=262208),
            "qk_norm": True, "final_softcap": read("final_logit_softcapping", None),
            "rope": ((FULL, read.rope(FULL, theta=1_000_000.0)), (SLIDING, _local_rope(read, local)))}


def _local_rope(read: _Reader, theta: float) -> Rope:
    params = read.config.get("rope_parameters") or {}
    if isinstance(params.get(SLIDING), Mapping):
        return read.rope(SLIDING)
    return Rope(float(theta))  # older files: `rope_scaling` applies to the global layers only


def _layer_types(read: _Reader, types: list[str]) -> tuple[str, ...]:
    if len(types) != read("num_hidden_layers") or set(types) - {FULL, SLIDING}:
        read.refuse("layer_types", types, f"one of {FULL!r}, {SLIDING!r} per layer")
    return tuple(types)


_READERS: dict[str, Callable[[_Reader], dict[str, Any]]] = {
    "gpt2": _gpt2, "llama": _llama, "mistral": _mistral, "qwen2": _qwen2, "qwen3": _qwen3, "gemma2": _gemma2,
    "gemma3_text": _gemma3}
