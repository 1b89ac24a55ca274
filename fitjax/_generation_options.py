"""`GenerationOptions`: every option of a generation, its default, its check and its meaning, in
one place. `Trainer.generate`'s keyword arguments and `GenerationMonitor`'s build one; the decode
program (`fitjax.loop._decode`) reads it. A value, beside `precision`: the loop and the callbacks
above it both take it."""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

__all__ = ["FLOOR", "INT32_MAX", "GenerationOptions"]

FLOOR = 16  # the smallest prompt bucket (`fitjax.loop._prompts.bucket`)
INT32_MAX = 2**31 - 1  # token ids and positions are int32 on the devices


@dataclasses.dataclass(frozen=True)
class GenerationOptions:
    """How `Trainer.generate` continues prompts, checked when made (a `ValueError` naming the
    option and the value); `max_new_tokens` and `use_cache` key the compiled programs, the others
    are their inputs (changing them compiles nothing).

    Attributes:
        max_new_tokens: tokens generated per prompt at most; with the longest prompt within the
            model's `max_positions` (if it has one) and int32's positions.
        temperature: 0 picks the most likely token (greedy); otherwise the logits are divided by
            it and a token drawn.
        top_k: draw among the k most likely tokens only (None: all).
        top_p: draw among the most likely tokens holding this probability mass (None: all).
        seed: the draws' random key: the same seed, prompts and weights give the same tokens.
        eos_token_id: the id (or ids) a row stops at, kept as a tuple; None: `Trainer.generate`
            takes the tokenizer's, else the model's `config.eos_token_id`, else none (rows run to
            `max_new_tokens`).
        use_cache: None: a KV cache when the model has `init_cache`; False: re-run the whole
            sequence for each token (slower, the same tokens).

    Args:
        where: who was given the options, named in the errors (not kept).

    Example:
        >>> import fitjax as fj
        >>> fj.GenerationOptions(max_new_tokens=32, temperature=0.8, top_p=0.95).top_p
        0.95
        >>> fj.GenerationOptions(top_k=0)
        Traceback (most recent call last):
        ...
        ValueError: GenerationOptions(top_k=...) must be None (every token) or a positive int ...; got 0.
    """

    max_new_tokens: int = 64
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0
    eos_token_id: int | Sequence[int] | None = None
    use_cache: bool | None = None
    where: dataclasses.InitVar[str] = "GenerationOptions"

    def __post_init__(self, where: str) -> None:
        max_new_tokens, temperature, top_k, top_p, seed, use_cache = (
            self.max_new_tokens, self.temperature, self.top_k, self.top_p, self.seed, self.use_cache)
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"{where}(max_new_tokens=...) must be a positive int (tokens generated per "
                             f"prompt at most); got {max_new_tokens!r}.")
        if max_new_tokens > INT32_MAX - FLOOR:
            raise ValueError(f"{where}(max_new_tokens=...) must be at most {INT32_MAX - FLOOR:,} (positions "
                             f"are int32 on the devices, and the KV cache holds them all); got "
                             f"{max_new_tokens!r}. Pass the tokens you need.")
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature >= 0:
            raise ValueError(f"{where}(temperature=...) must be a number >= 0 (0: greedy, the most likely "
                             f"token each step; 1: the model's distribution); got {temperature!r}.")
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
            raise ValueError(f"{where}(top_k=...) must be None (every token) or a positive int (draw among "
                             f"the k most likely tokens); got {top_k!r}.")
        if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, (int, float))
                                  or not 0 < top_p <= 1):
            raise ValueError(f"{where}(top_p=...) must be None or a number in (0, 1] (draw among the most "
                             f"likely tokens holding that probability mass); got {top_p!r}.")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"{where}(seed=...) must be an int (the sampling's random key); got {seed!r}.")
        if use_cache not in (None, True, False):
            raise ValueError(f"{where}(use_cache=...) must be None (a KV cache when the model has "
                             f"`init_cache`), True or False; got {use_cache!r}.")
        set_ = object.__setattr__  # frozen: the checked values in their one form
        set_(self, "temperature", float(temperature))
        set_(self, "top_p", None if top_p is None else float(top_p))
        set_(self, "eos_token_id", None if self.eos_token_id is None else _token_ids(self.eos_token_id, where))

    @property
    def eos(self) -> tuple[int, ...]:
        """The ids a row stops at (none when `eos_token_id` is None)."""
        return self.eos_token_id or ()


def _token_ids(value: Any, where: str) -> tuple[int, ...]:
    values = None
    if isinstance(value, (int, np.integer)):
        values = (value,)
    elif not isinstance(value, (str, bytes)):
        try:
            values = tuple(value)
        except TypeError:  # not a sequence: refused below
            pass
    if values is None or any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 <= v <= INT32_MAX
                             for v in values):
        raise ValueError(f"{where}(eos_token_id=...) must be None, a token id (an int from 0 to "
                         f"{INT32_MAX:,}: ids are int32 on the devices) or a list of them; got {value!r}.")
    return tuple(int(v) for v in values)
