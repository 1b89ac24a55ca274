"""Model FLOPs: the work a step must do, as opposed to what XLA's compiled program does.

XLA's count includes what rematerialization recomputes, so an MFU from it reads high. The model
count is the one MaxText and PaLM report. A module's own `flops_per_batch` (Lightning's attribute)
comes first: a count the user wrote overrides any estimate, as in Lightning. Else, for a transformer
that declares its shape, 6 FLOPs per parameter per token (forward and backward) plus the attention
scores and their weighted sum (`12 × layers × context × width` per token, PaLM's appendix B, the
causal mask's skipped half counted). A `fitjax.models` language model declares nothing: its shape
is read from its config and the batch (`causal_lm_shape`), and N leaves out the tables it only
looks up (the token table when the output layer has its own, GPT-2's position table).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax

from fitjax.models import CausalLM

__all__ = ["ModelFlops", "TransformerShape", "causal_lm_shape", "model_flops"]


@dataclasses.dataclass(frozen=True)
class TransformerShape:
    """A transformer's shape, declared on a `LitModule` as `transformer_shape` so that the planner
    and `ThroughputMonitor` count its model FLOPs as `6N + 12·layers·context·width` per token.

    Args:
        layers: transformer blocks.
        width: the residual width (d_model).
        context: tokens per sequence (each batch row is one sequence of `context` tokens).

    Example:
        >>> import fitjax as fj
        >>> class GPTModule(fj.LitModule):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.transformer_shape = fj.TransformerShape(layers=12, width=768, context=1024)
    """

    layers: int
    width: int
    context: int

    def flops_per_token(self, num_params: int) -> int:
        """Training FLOPs per token for a model of `num_params` parameters (N: all of them,
        embeddings included)."""
        return 6 * num_params + 12 * self.layers * self.context * self.width


@dataclasses.dataclass(frozen=True)
class ModelFlops:
    """Model FLOPs of one optimizer step over the whole batch, and where the count comes from."""

    per_step: float
    #: "6N+attention" (a declared `transformer_shape`), "flops_per_batch" (the module's attribute)
    source: str


def causal_lm_shape(module: Any, batch: Any) -> tuple[TransformerShape, int] | None:
    """A `fitjax.models` module's (`module.model` a `CausalLM`) shape for `batch` (its
    `"tokens"`: [rows, length + 1], or [rows, length] beside `"targets"` as `TextLoader` makes
    them), and the parameters it only looks up, not multiplies (no FLOPs: the token table when
    the output layer is its own, GPT-2's position table); None for any other module or batch.
    The attention width is heads × head_dim (grouped key/value heads attend as many queries);
    sliding-window layers are counted as full ones."""
    model = getattr(module, "model", None)
    tokens = batch.get("tokens") if isinstance(batch, dict) else None
    if not isinstance(model, CausalLM) or tokens is None or len(tokens.shape) != 2:
        return None
    config = model.config
    context = tokens.shape[1] - (0 if "targets" in batch else 1)
    lookups = (0 if config.tie_word_embeddings else config.vocab_size * config.hidden_size) + (
        config.max_position_embeddings * config.hidden_size if config.gpt2_layout else 0)
    return TransformerShape(config.num_layers, config.num_heads * config.head_dim, context), lookups


def model_flops(module: Any, params: Any, *, rows_per_step: int, batches_per_step: int,
                devices: int, batch: Any = None) -> ModelFlops | None:
    """The module's model FLOPs per optimizer step (all devices together), or None when it
    declares neither a `flops_per_batch` nor a `transformer_shape` (and is no `fitjax.models`
    language model given its `batch`). `flops_per_batch` wins when both are declared
    (Lightning's override: the user's own count).

    `rows_per_step`: sequences in one optimizer step (all micro-batches); `batches_per_step`:
    micro-batches per step; `devices`: over which Lightning's per-device `flops_per_batch`
    counts; `batch`: one micro-batch (arrays or shapes), for `causal_lm_shape`."""
    per_batch = getattr(module, "flops_per_batch", None)
    if isinstance(per_batch, (int, float)) and not isinstance(per_batch, bool) and per_batch > 0:
        # Lightning's meaning: one batch's FLOPs on one device
        return ModelFlops(float(per_batch) * batches_per_step * devices, "flops_per_batch")
    shape, lookups = getattr(module, "transformer_shape", None), 0
    if not isinstance(shape, TransformerShape):
        shape, lookups = causal_lm_shape(module, batch) or (None, 0)
    if isinstance(shape, TransformerShape):
        n = sum(math.prod(p.shape) for p in jax.tree.leaves(params)) - lookups
        return ModelFlops(float(shape.flops_per_token(n)) * rows_per_step * shape.context, "6N+attention")
    return None
