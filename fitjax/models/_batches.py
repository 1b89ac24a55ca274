"""The batches `CausalLMModule` trains on, as one form: Hugging Face's `input_ids` /
`attention_mask` / `labels` (what every `transformers` and TRL collator makes) become the keys
of a `fj.data.TextLoader` batch, and a batch of neither kind is refused naming what is taken.

Hugging Face's `labels` sit under their own input (the model shifts them): the target of input
token t is `labels[t + 1]`, -100 carries no loss; `attention_mask` 0 marks padding, left or
right, whose positions restart as `transformers` numbers them (the cumulative count of real
tokens). Traced inside the loss: only array operations, no host work.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp

__all__ = ["IGNORE_INDEX", "KEYS_TAKEN", "as_lm_batch"]

IGNORE_INDEX = -100  # Hugging Face's label of a token without loss (torch's cross-entropy default)

KEYS_TAKEN = ("'tokens' (ids [batch, length + 1], with optional 'segment_ids' and 'positions'); "
              "fj.data.TextLoader's 'tokens', 'targets', 'loss_mask', 'segment_ids', 'positions'; or Hugging "
              "Face's 'input_ids' with optional 'attention_mask' and 'labels' (-100: no loss)")


def as_lm_batch(batch: Any, *, owner: str = "CausalLMModule") -> Mapping[str, Any]:
    """`batch` in fitjax's keys: a Hugging Face batch as a `TextLoader` batch (`tokens`,
    `targets`, `loss_mask`, `segment_ids`, `positions`, each [batch, length - 1]); fitjax's own
    batches as they are.

    Raises:
        ValueError: for a batch with neither 'tokens' nor 'input_ids', naming the keys taken.

    Example:
        >>> import numpy as np
        >>> batch = as_lm_batch({"input_ids": np.array([[5, 6, 7, 0]]),
        ...                      "attention_mask": np.array([[1, 1, 1, 0]]),
        ...                      "labels": np.array([[-100, 6, 7, -100]])})
        >>> batch["tokens"].tolist(), batch["targets"].tolist(), batch["loss_mask"].tolist()
        ([[5, 6, 7]], [[6, 7, 0]], [[1.0, 1.0, 0.0]])
    """
    if isinstance(batch, Mapping) and "tokens" in batch:
        return batch
    if not isinstance(batch, Mapping) or "input_ids" not in batch:
        got = f"a dict with the keys {sorted(map(str, batch))}" if isinstance(batch, Mapping) else \
            f"{type(batch).__name__}"
        raise ValueError(f"{owner}.loss got {got}; it takes a dict batch with {KEYS_TAKEN}. Rename the keys in "
                         "the collate function or the data set.")
    ids = jnp.asarray(batch["input_ids"])
    attention = batch.get("attention_mask")
    attention = jnp.ones_like(ids) if attention is None else jnp.asarray(attention).astype(ids.dtype)
    labels = jnp.asarray(batch["labels"]) if batch.get("labels") is not None else jnp.where(attention > 0, ids,
                                                                                              IGNORE_INDEX)
    targets = labels[:, 1:]
    learned = (targets != IGNORE_INDEX) & (attention[:, 1:] > 0)
    positions = jnp.maximum(jnp.cumsum(attention, axis=1) - 1, 0)
    return {"tokens": ids[:, :-1], "targets": jnp.where(learned, targets, 0).astype(ids.dtype),
            "loss_mask": learned.astype(jnp.float32), "segment_ids": (attention[:, :-1] > 0).astype(jnp.int32),
            "positions": positions[:, :-1].astype(jnp.int32)}
