"""8-bit block-wise storage of Adam's moments, and stochastic rounding to it and to bfloat16.

A moment is stored as codes of its parameter's own shape (so it shards like the parameter) and one
float32 absmax per block of `block_size` values along the last dimension (padded with zeros inside
the computation only). Rounding is stochastic, from bits derived from the optimizer step, so the
stored moment is unbiased (a deterministic round would freeze `nu`: `0.999 * nu` rounds back to
`nu` in bfloat16 and in 8 bits) and the same step always rounds the same way (exact resume).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

MU_LEVELS = 127  # signed int8 codes in [-127, 127]
NU_LEVELS = 255  # unsigned uint8 codes in [0, 255]


MIN_SIZE = 4096  # bitsandbytes' min_8bit_size: smaller leaves keep float32 moments
MIN_LAST_DIM = 32  # a block of fewer values costs 4 bytes of scale per 8 or fewer saved


def block_for(shape: tuple[int, ...], block_size: int) -> int | None:
    """The block size along the last dimension of a leaf of `shape`; None to keep it float32."""
    if math.prod(shape) < MIN_SIZE or not shape or shape[-1] < MIN_LAST_DIM:
        return None
    return min(block_size, shape[-1])


def num_blocks(shape: tuple[int, ...], block_size: int) -> int:
    return math.ceil(shape[-1] / block_size)


def absmax_shape(shape: tuple[int, ...], block_size: int) -> tuple[int, ...]:
    return (*shape[:-1], num_blocks(shape, block_size))


def _blocks(x: jax.Array, block_size: int) -> jax.Array:
    """`x` (at least 1-D) as `(*lead, blocks, block_size)`, the last dimension padded with zeros."""
    pad = num_blocks(x.shape, block_size) * block_size - x.shape[-1]
    x = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, pad)])
    return x.reshape(*x.shape[:-1], -1, block_size)


def _unblocks(x: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    x = x.reshape(*x.shape[:-2], -1)
    return x[..., : shape[-1]]


def uniform(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    return jax.random.uniform(key, shape, jnp.float32)


def to_bfloat16(x: jax.Array, key: jax.Array) -> jax.Array:
    """`x` (float32) rounded stochastically to bfloat16: random low 16 bits added, then cut."""
    bits = lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32)
    noise = jax.random.bits(key, x.shape, jnp.uint32) & jnp.uint32(0xFFFF)
    rounded = (bits + noise) & jnp.uint32(0xFFFF0000)
    return lax.bitcast_convert_type(rounded, jnp.float32).astype(jnp.bfloat16)


def quantize_mu(mu: jax.Array, key: jax.Array, block_size: int) -> tuple[jax.Array, jax.Array]:
    """Signed codes `round(127 * sign(q) * sqrt|q|)` of `q = mu / absmax` per block, and absmax.

    The square-root map spends more codes near zero than a linear one: a value 1/16129 of its
    block's largest still gets a non-zero code (linear: 1/127)."""
    blocks = _blocks(mu.astype(jnp.float32), block_size)
    absmax = jnp.max(jnp.abs(blocks), axis=-1)
    q = blocks / jnp.where(absmax > 0, absmax, 1.0)[..., None]
    scaled = jnp.sqrt(jnp.abs(q)) * MU_LEVELS
    codes = jnp.minimum(jnp.floor(scaled + uniform(key, scaled.shape)), MU_LEVELS) * jnp.sign(q)
    return _unblocks(codes, mu.shape).astype(jnp.int8), absmax


def dequantize_mu(codes: jax.Array, absmax: jax.Array, block_size: int) -> jax.Array:
    c = _blocks(codes.astype(jnp.float32), block_size) / MU_LEVELS
    return _unblocks(jnp.sign(c) * c * c * absmax[..., None], codes.shape)


def quantize_nu(nu: jax.Array, key: jax.Array, block_size: int) -> tuple[jax.Array, jax.Array]:
    """Unsigned codes `round(255 * sqrt(r / absmax))` of `r = sqrt(nu)` per block, and absmax of r.

    `nu` is kept as its fourth root: a value 2.4e-10 of its block's largest still gets a non-zero
    code, and a non-zero `nu` never gets code 0 (it would divide the update by `eps` alone)."""
    blocks = _blocks(jnp.sqrt(nu.astype(jnp.float32)), block_size)
    absmax = jnp.max(blocks, axis=-1)
    q = blocks / jnp.where(absmax > 0, absmax, 1.0)[..., None]
    scaled = jnp.sqrt(q) * NU_LEVELS
    codes = jnp.minimum(jnp.floor(scaled + uniform(key, scaled.shape)), NU_LEVELS)
    codes = jnp.where(q > 0, jnp.maximum(codes, 1.0), 0.0)
    return _unblocks(codes, nu.shape).astype(jnp.uint8), absmax


def dequantize_nu(codes: jax.Array, absmax: jax.Array, block_size: int) -> jax.Array:
    c = _blocks(codes.astype(jnp.float32), block_size) / NU_LEVELS
    r = c * c * absmax[..., None]
    return _unblocks(r * r, codes.shape)
