"""How fitjax compiles for XLA:TPU: the attention kernel `fj.nn.attention` picks there, and the
compiler options every TPU program fitjax compiles is given.

**Attention (`attention_kernel`).** On a TPU, `fj.nn.attention(implementation="auto")` runs JAX's
Pallas "splash" attention kernel (`jax.experimental.pallas.ops.tpu.splash_attention`, the one
MaxText trains with): a flash-attention kernel that never writes the [heads, q_length,
kv_length] scores to HBM, and skips the blocks a causal, local or segment mask hides. It is used
where its constraints hold (`splash_blocks`): lengths that are multiples of 128 (its smallest
block), a head_dim that is a multiple of 64, one segment-id array shared by queries and keys,
and no `positions` pair (a query chunk in a KV cache). Elsewhere the plain path runs. Blocks are
the largest multiples of 128 up to 512 that divide the lengths (MaxText's v5e default is 512 for every
block). The kernel is a custom call that XLA's SPMD partitioner does not split: in a program
sharded over several chips, XLA gathers its operands onto each chip (correct, not fast; a
`shard_map` around it is the way to split it, not done here). On one chip this does not arise.
The choice can be changed without touching code, to measure it on a chip:

    FITJAX_TPU_ATTENTION=xla            # "auto" on TPU runs the plain path
    FITJAX_TPU_ATTENTION=splash         # the default
    FITJAX_TPU_ATTENTION=splash-fused   # splash with its fused backward kernel (dq, dk, dv in one)
    FITJAX_TPU_ATTENTION_BLOCK=256      # the largest block tried (a multiple of 128)

**Compiler options (`compiler_options`).** Each program fitjax compiles for a TPU (the train
step, the state's init, the evaluation and predict steps) is given these XLA:TPU options as
per-program compile options (not `LIBTPU_INIT_ARGS`, which is read once per process), so a fit
can be measured with and without each one:

- `xla_tpu_scoped_vmem_limit_kib=98304`: the on-chip vector memory (VMEM: 128 MiB on v5e and
  v6e) one fused operation may use as scratch, from XLA's default of 16-32 MiB to 96 MiB. Larger
  tiles for the matrix products and the fusions around them; MaxText's dense models on v5e/v6e
  and AXLearn's v6e defaults set this value. The one option here that matters on one chip:
  everything else in MaxText's v5e scripts overlaps collectives (all-gathers, all-reduces)
  across chips, which one chip does not run.

The set is read from `FITJAX_XLA_TPU_OPTIONS` when a program is built, so each option can be
switched for one run:

    FITJAX_XLA_TPU_OPTIONS=none                                   # fitjax adds no option
    FITJAX_XLA_TPU_OPTIONS=-xla_tpu_scoped_vmem_limit_kib         # the defaults less one
    FITJAX_XLA_TPU_OPTIONS=xla_tpu_scoped_vmem_limit_kib=65536    # a default changed
    FITJAX_XLA_TPU_OPTIONS="none,xla_tpu_enable_latency_hiding_scheduler=true"   # only this one

Entries are separated by commas or spaces; `none` drops the defaults, `-name` drops one,
`name=value` (or XLA's flag form `--name=value`) adds or replaces one. An option the user passes for a program (`compiler_options`'
`options`) wins over these. Other platforms get nothing from here.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

__all__ = ["ATTENTION_ENV", "BLOCK_ENV", "DEFAULT_OPTIONS", "OPTIONS_ENV", "SplashBlocks", "attention_kernel",
           "compiler_options", "options_from", "splash_blocks"]

OPTIONS_ENV = "FITJAX_XLA_TPU_OPTIONS"
ATTENTION_ENV = "FITJAX_TPU_ATTENTION"
BLOCK_ENV = "FITJAX_TPU_ATTENTION_BLOCK"

# (name, value): the module docstring says why each is on
DEFAULT_OPTIONS: dict[str, Any] = {
    "xla_tpu_scoped_vmem_limit_kib": 98304,
}

_KERNELS = ("splash", "splash-fused", "xla")


def options_from(spec: str | None, defaults: dict[str, Any] | None = None) -> dict[str, Any]:
    """The options a `FITJAX_XLA_TPU_OPTIONS` value (`spec`; None: unset) makes of `defaults`
    (`DEFAULT_OPTIONS` when None). Values stay strings, as XLA parses its flags.

    Example:
        >>> from fitjax.step import xla_tpu
        >>> xla_tpu.options_from("-xla_tpu_scoped_vmem_limit_kib, xla_tpu_a=true")
        {'xla_tpu_a': 'true'}
    """
    options = dict(DEFAULT_OPTIONS if defaults is None else defaults)
    for entry in (spec or "").replace(",", " ").split():
        if entry == "none":
            options.clear()
        elif entry.startswith("-") and "=" not in entry:
            options.pop(entry.lstrip("-"), None)
        elif "=" in entry and entry.split("=", 1)[0]:
            name, value = entry.split("=", 1)
            options[name.lstrip("-")] = value
        else:
            raise ValueError(f"{OPTIONS_ENV}={spec!r}: entry {entry!r} is not one of 'none', '-name' or "
                             f"'name=value' (entries separated by commas or spaces), e.g. "
                             f"{OPTIONS_ENV}='-xla_tpu_scoped_vmem_limit_kib'")
    return options


def compiler_options(platform: str, options: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """`options` for a program compiled for `platform`: on "tpu", fitjax's TPU options
    (`FITJAX_XLA_TPU_OPTIONS`, module docstring) under them; elsewhere `options` unchanged."""
    if platform != "tpu":
        return options
    chosen = {**options_from(os.environ.get(OPTIONS_ENV)), **(options or {})}
    return chosen or None


def attention_kernel() -> str:
    """What `fj.nn.attention(implementation="auto")` runs on a TPU where the kernel's constraints
    hold: "splash" (the default), "splash-fused" or "xla" (`FITJAX_TPU_ATTENTION`)."""
    kernel = os.environ.get(ATTENTION_ENV, "splash") or "splash"
    if kernel not in _KERNELS:
        raise ValueError(f"{ATTENTION_ENV}={kernel!r} must be one of {_KERNELS}; unset it for 'splash'")
    return kernel


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
