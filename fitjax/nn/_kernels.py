"""Which attention kernel `fj.nn.attention` runs, and its blocks: the choice beside the kernels.

The choice is an argument (`attention(implementation=...)`, which models take as a
hyperparameter, e.g. the GPT example's `GPTModule(attention=...)`, saved with the others).
Environment variables only override it, to measure a kernel on a chip without touching code:

    FITJAX_TPU_ATTENTION=xla            # a program for a TPU runs the plain path
    FITJAX_TPU_ATTENTION=splash         # the splash kernel where it applies (what "auto" does)
    FITJAX_TPU_ATTENTION=splash-fused   # splash with its fused backward kernel (dq, dk, dv in one)
    FITJAX_TPU_ATTENTION_BLOCK=256      # the largest block tried (a multiple of 128)

`FITJAX_TPU_ATTENTION` applies to programs traced for a TPU only (`fitjax._platform`), to every
implementation asked for there but "cudnn" (a GPU's); "splash" keeps an explicit "pallas" (which
raises where the kernel cannot compute a call) and turns the rest into "auto". Unset, the
argument stands.

**The splash kernel's blocks (`splash_blocks`).** The kernel applies where lengths are multiples
of 128 (its smallest block) and head_dim a multiple of 64. Blocks are the largest multiples of 128
up to 512 that divide the lengths (MaxText's v5e default is 512 for every block).
"""

from __future__ import annotations

import os
from typing import NamedTuple

__all__ = ["ATTENTION_ENV", "BLOCK_ENV", "IMPLEMENTATIONS", "Choice", "SplashBlocks", "attention_kernel", "splash_blocks"]

ATTENTION_ENV = "FITJAX_TPU_ATTENTION"
BLOCK_ENV = "FITJAX_TPU_ATTENTION_BLOCK"

#: `attention(implementation=...)`'s values (its docstring says what each runs)
IMPLEMENTATIONS = ("auto", "xla", "pallas", "pallas-fused", "cudnn")
_OVERRIDES = ("splash", "splash-fused", "xla")


class Choice(NamedTuple):
    """What one call runs: "auto", "xla", "pallas" or "cudnn" (as `attention`'s argument), and
    whether the splash kernel's backward is its fused one."""

    implementation: str
    fused_backward: bool = False


def attention_kernel(implementation: str, platform: str) -> Choice:
    """What a call asking for `implementation` (one of `IMPLEMENTATIONS`) runs in a program traced
    for `platform`, after `FITJAX_TPU_ATTENTION` (read for TPU programs only)."""
    fused = implementation == "pallas-fused"
    chosen = Choice("pallas" if fused else implementation, fused)
    override = os.environ.get(ATTENTION_ENV, "")
    if not override or platform != "tpu" or implementation == "cudnn":
        return chosen
    if override not in _OVERRIDES:
        raise ValueError(f"{ATTENTION_ENV}={override!r} must be one of {_OVERRIDES}; unset it to run what the "
                         f"model asks for (attention(implementation=...))")
    if override == "xla":
        return Choice("xla")
    # the kernel: where it applies ("auto"), or everywhere as asked ("pallas" raises where it cannot)
    return Choice("pallas" if chosen.implementation == "pallas" else "auto", override == "splash-fused")


class SplashBlocks(NamedTuple):
    """The splash kernel's block sizes: queries and keys per block (forward and backward alike),
    and whether the backward computes dq, dk and dv in one kernel."""

    q: int
    kv: int
    fused_backward: bool = False


_LANES = 128  # the kernel's smallest block: a TPU vector register's lane count
_LARGEST = 512  # MaxText's v5e default for every block


def splash_blocks(q_length: int, kv_length: int, head_dim: int, *, fused_backward: bool = False) -> SplashBlocks | None:
    """Blocks for the splash kernel on these shapes, or None where it does not apply: lengths
    not multiples of 128, or a head_dim not a multiple of 64."""
    if q_length % _LANES or kv_length % _LANES or head_dim % 64:
        return None
    largest = _largest_block()

    def block(length: int) -> int:  # the largest multiple of 128 up to `largest` dividing `length`
        return next(size for size in range(largest, 0, -_LANES) if length % size == 0)

    return SplashBlocks(block(q_length), block(kv_length), fused_backward)


def _largest_block() -> int:
    value = os.environ.get(BLOCK_ENV, "")
    if not value:
        return _LARGEST
    if not value.isdigit() or int(value) % _LANES or int(value) == 0:
        raise ValueError(f"{BLOCK_ENV}={value!r} must be a positive multiple of {_LANES}, e.g. 512")
    return int(value)
