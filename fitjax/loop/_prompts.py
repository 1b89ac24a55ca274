"""Generation's host side of the text: prompts in (text through the module's tokenizer, or token
ids), checked and laid out as the decode program's left-padded batch, and the generated tokens
back out in the form the prompts came in (text, or id lists; one result for one prompt).

The batch layout (`layout`): prompts are left-padded to the bucket's length (16, 24, 32, 48,
64, 96, ... tokens), so a second call whose longest prompt falls in the same bucket reuses the
compiled program. Row i's prompt of n_i tokens has positions 0..n_i-1 (as `transformers`
numbers a left-padded prompt); its padding has segment id 0, which no real token attends to,
and the positions right after the prompt (n_i, n_i+1, ...). So a model may write its cache at
its own index (the same slots for every row: `fitjax.models`) or at `positions` (a padding
slot is then one a generated token overwrites before any query sees it): either way each row
generates exactly what it would alone. Rows added to divide the batch over the devices start
finished.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import numpy as np

from fitjax._generation_options import FLOOR, INT32_MAX  # FLOOR: padding costs nothing next to a compile

__all__ = ["Prompts", "bucket", "default_eos", "layout", "read_prompts"]


def default_eos(tokenizer: Any, config: Any) -> Any:
    """The end-of-sequence id(s) generation stops at when not given: the tokenizer's, else the
    model config's `eos_token_id` (a dict config or an object); None with neither."""
    for source in (tokenizer, config):
        value = source.get("eos_token_id") if isinstance(source, dict) else getattr(source, "eos_token_id", None)
        if value is not None:
            return value
    return None



def bucket(length: int) -> int:
    """The padded prompt length of prompts at most `length` long: 16, 24, 32, 48, 64, 96, ...
    (a power of two or 1.5 times one), so prompts of nearby lengths share one compilation and,
    past 16, less than a third of a row is padding."""
    size = FLOOR
    while size < length:
        size = size * 3 // 2 if size & (size - 1) == 0 else size * 4 // 3
    return size


@dataclasses.dataclass(frozen=True)
class Prompts:
    """The prompts as token ids, and how the results go back: as text (the prompts were text),
    and as one result (one prompt was given, not a list)."""

    tokens: list[np.ndarray]
    text: bool
    single: bool

    def answer(self, new: np.ndarray, eos: tuple[int, ...], tokenizer: Any) -> Any:
        """The generated tokens `new` [prompts, made] as `Trainer.generate` returns them: each
        row up to and including its first end-of-sequence token (a stopped row's later tokens
        are 0s), decoded without special tokens for text prompts; one result for one prompt."""
        results = []
        for row in new:
            stops = np.flatnonzero(np.isin(row, eos)) if eos else ()
            results.append(row[:stops[0] + 1 if len(stops) else len(row)].tolist())
        if self.text:
            results = [tokenizer.decode(ids, skip_special_tokens=True) for ids in results]
        return results[0] if self.single else results


def read_prompts(prompts: Any, tokenizer: Any) -> Prompts:
    """Token id lists or arrays (one prompt, a list of them, or a 2-D array), or text (one string
    or a list) when there is a tokenizer."""
    single = isinstance(prompts, str) or _is_ids(prompts)
    many = [prompts] if single else list(prompts)
    if not many:
        raise ValueError("Trainer.generate(prompts=...) is empty: pass a prompt or a list of them.")
    text = [isinstance(p, str) for p in many]
    if any(text):
        if not all(text):
            raise ValueError("Trainer.generate(prompts=...) mixes text and token ids; pass one kind.")
        if tokenizer is None:
            raise ValueError(f"Trainer.generate(prompts={many[0]!r}, ...): text needs a tokenizer; set "
                             "`module.tokenizer` (e.g. `transformers.AutoTokenizer.from_pretrained(folder)` in "
                             "__init__) or pass token ids.")
        ids = [_encode(tokenizer, p) for p in many]
    else:
        ids = []
        for i, p in enumerate(many):
            if not _is_ids(p):
                raise ValueError(f"Trainer.generate(prompts=...): prompt {i} is {p!r}; a prompt is a list or "
                                 "1-D array of token ids (ints), or text with `module.tokenizer` set.")
            ids.append(_int32_ids(p, i))
    for i, p in enumerate(ids):
        if p.size == 0:
            raise ValueError(f"Trainer.generate(prompts=...): prompt {i} has no tokens; every prompt needs one.")
    return Prompts(ids, all(text), single)


def _is_ids(p: Any) -> bool:
    """Whether `p` is one prompt of token ids: a 1-D int array or a list of ints."""
    if isinstance(p, (np.ndarray, jax.Array)):
        return p.ndim == 1 and p.dtype.kind in "iu"
    return isinstance(p, (list, tuple)) and all(isinstance(t, (int, np.integer)) and not isinstance(t, bool)
                                                for t in p)


def _int32_ids(prompt: Any, i: int) -> np.ndarray:
    """Prompt `i`'s ids as int32, refusing an id int32 cannot hold (NumPy raises an OverflowError
    for a list, and wraps an int64 array's ids around silently)."""
    values = list(prompt) if isinstance(prompt, (list, tuple)) else np.asarray(prompt).tolist()
    for j, v in enumerate(values):
        if not -INT32_MAX - 1 <= v <= INT32_MAX:
            raise ValueError(f"Trainer.generate(prompts=...): prompt {i} has token id {v!r} at position {j}, "
                             "which int32 cannot hold (token ids are int32 on the devices; a vocabulary's ids run "
                             "from 0 to its size - 1). Pass the tokenizer's ids.")
    return np.asarray(values, dtype=np.int32)


def _encode(tokenizer: Any, text: str) -> np.ndarray:
    encoded = tokenizer.encode(text)  # a transformers tokenizer: ids; a `tokenizers.Tokenizer`: `.ids`
    return np.asarray(getattr(encoded, "ids", encoded), dtype=np.int32)


def layout(prompts: Sequence[np.ndarray], *, rows: int, length: int) -> dict[str, np.ndarray]:
    """The left-padded batch (see the module doc): `tokens`, `positions`, `segment_ids` int32
    [rows, length], `lengths` [rows] (0 for the rows added beyond the prompts). Padding is token
    0, an id every vocabulary has (an id past the table would read NaN into the masked values)."""
    tokens = np.zeros((rows, length), np.int32)
    lengths = np.zeros(rows, np.int32)
    segment_ids = np.zeros((rows, length), np.int32)
    positions = np.tile(np.arange(length, dtype=np.int32), (rows, 1))
    for i, prompt in enumerate(prompts):
        n = len(prompt)
        tokens[i, length - n:] = prompt
        segment_ids[i, length - n:] = 1
        positions[i] = np.concatenate([np.arange(n, length), np.arange(n)])  # padding: after the prompt
        lengths[i] = n
    return {"tokens": tokens, "positions": positions, "segment_ids": segment_ids, "lengths": lengths}

