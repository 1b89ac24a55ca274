"""Token ids checked where they enter, against the model's vocabulary: a loader's tokenizer at
fit start, the first batch's ids, the prompts of `Trainer.generate`.

An id past the embedding table is no error on an accelerator: XLA clamps the gather (or reads
NaN), so a fit trains on a `nan` loss and a generation returns zeros, and a negative id reads
the table from its end (-5 is id `vocab - 5`). Each check here runs on the host, once per fit or
generation (never per step), and names the id, where it came from and the vocabulary.

The vocabulary is the model's `vocab_size` where it says it (`module.vocab_size`,
`model.vocab_size`, `model.config.vocab_size`: every model of `fitjax.models`); for a generation
without one, the width of the model's logits (one abstract trace, nothing computed). With no
vocabulary known, negative input ids are still refused.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fitjax import module as module_lib

__all__ = ["INPUT_KEYS", "TARGET_KEYS", "check_batch", "check_loaders", "check_prompts", "generation_vocab",
           "tokenizer_size", "vocab_size"]

#: batch keys holding the model's input ids: fitjax's (`TextLoader`'s) and Hugging Face's
INPUT_KEYS = ("tokens", "input_ids")
#: batch keys holding target ids; negative values are the user's "no loss" (-100, -1) and pass
TARGET_KEYS = ("targets", "labels")


def vocab_size(module: Any) -> int | None:
    """The vocabulary size the module's model declares (see the module doc), or None."""
    model = module_lib.unwrap_host_model(getattr(module, "model", None))
    config = getattr(model, "config", None)
    for value in (getattr(module, "vocab_size", None), getattr(model, "vocab_size", None),
                  config.get("vocab_size") if isinstance(config, Mapping) else getattr(config, "vocab_size", None)):
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value > 0:
            return int(value)
    return None


def tokenizer_size(tokenizer: Any) -> int | None:
    """How many ids `tokenizer` may produce (added tokens included): `len()` of a transformers
    tokenizer, `get_vocab_size(with_added_tokens=True)` of a `tokenizers.Tokenizer`; None for
    another object."""
    size = getattr(tokenizer, "get_vocab_size", None)
    if callable(size):
        return int(size(with_added_tokens=True))
    try:
        return int(len(tokenizer))
    except TypeError:
        return None


def check_loaders(module: Any, loaders: Sequence[tuple[str, Any]]) -> None:
    """Refuses a loader whose tokenizer (`loader.tokenizer`: a `TextLoader`'s) makes ids the
    model has no row for; `loaders` are `(name, loader)` pairs, named in the error."""
    vocab = vocab_size(module)
    if vocab is None:
        return
    for name, loader in loaders:
        # the loader's own, or its source's: a TextLoader as `as_loader` wraps it
        tokenizer = getattr(loader, "tokenizer", None) or getattr(getattr(loader, "_source", None), "tokenizer", None)
        size = None if tokenizer is None else tokenizer_size(tokenizer)
        if size is not None and size > vocab:
            raise ValueError(
                f"{name}'s tokenizer makes ids 0..{size - 1} ({size} tokens, added ones included), but "
                f"{type(module).__name__}'s model has a vocabulary of {vocab} (its vocab_size): ids {vocab} and "
                f"above have no embedding and would train on a nan loss. Use the model's own tokenizer, or a "
                f"model with vocab_size >= {size} (e.g. `vocab_size: len(tokenizer)` in its config).")


def check_batch(batch: Any, vocab: int | None, *, where: str) -> None:
    """Refuses ids outside `[0, vocab)` in a batch's input keys (`INPUT_KEYS`) and ids `>= vocab`
    in its target keys (`TARGET_KEYS`); `where` names the batch. On the host: a batch of device
    arrays is fetched (call it once, on the first batch)."""
    if not isinstance(batch, Mapping):
        return
    for key in (*INPUT_KEYS, *TARGET_KEYS):
        if key not in batch or not _is_int_array(batch[key]):
            continue
        ids = np.asarray(batch[key])  # sync point when the batch is on the device: once per fit
        if ids.size == 0:
            continue
        low = 0 if key in INPUT_KEYS else None
        _check_range(ids, low, vocab, f"{where}[{key!r}]", "Check the tokenizer the data was made with.")


def check_prompts(prompts: Sequence[np.ndarray], vocab: int | None) -> None:
    """Refuses a prompt of `Trainer.generate` holding an id outside `[0, vocab)`."""
    for i, prompt in enumerate(prompts):
        _check_range(np.asarray(prompt), 0, vocab, f"Trainer.generate(prompts=...): prompt {i}",
                     "Encode the prompts with the model's tokenizer.")


def generation_vocab(module: Any, variables: tuple) -> int:
    """The vocabulary of a generation: the declared one, else the width of the logits
    `module.generate_step` returns (an abstract trace on `(params, model_state)`: no compile)."""
    declared = vocab_size(module)
    if declared is not None:
        return declared
    spec = module.step_spec()
    # kept by the module per binding, as the generation programs are: one trace per model
    known = module.__dict__.setdefault("_generation_vocab", {})
    if spec.binding not in known:
        known.clear()  # a new binding (`apply_lora`) makes the old one's entry stale
        known[spec.binding] = _logits_width(module, spec, variables)
    return known[spec.binding]


def _logits_width(module: Any, spec: Any, variables: tuple) -> int:
    tokens = jnp.zeros((1, 1), jnp.int32)

    def logits(params, model_state):
        def fn(model, tokens):
            return module.generate_step(model, tokens, positions=jnp.zeros_like(tokens),
                                        segment_ids=jnp.ones_like(tokens), cache=None)[0]

        with spec.mode(False):
            return spec.binding.apply(fn, params, model_state, jax.random.key(0), tokens, train=False)[0]

    return int(jax.eval_shape(logits, *variables[:2]).shape[-1])


def _is_int_array(value: Any) -> bool:
    return hasattr(value, "dtype") and np.dtype(value.dtype).kind in "iu" and np.ndim(value) >= 1


def _check_range(ids: np.ndarray, low: int | None, vocab: int | None, what: str, fix: str) -> None:
    bad = np.zeros(ids.shape, bool)
    if low is not None:
        bad |= ids < low
    if vocab is not None:
        bad |= ids >= vocab
    if not bad.any():
        return
    at = tuple(int(i) for i in np.argwhere(bad)[0])
    value = int(ids[at])
    allowed = f"the vocabulary has {vocab} ids, 0..{vocab - 1}" if vocab is not None else \
        "ids are never negative (the model's vocabulary size is not known)"
    where = f" at {at[0] if len(at) == 1 else list(at)}" if ids.ndim else ""
    raise ValueError(f"{what} holds the token id {value}{where} ({int(bad.sum())} out of range in all); "
                     f"{allowed}. {fix}")
