"""8-bit block-wise storage of Adam's moments, and stochastic rounding to it and to bfloat16.

A moment is stored as codes of its parameter's own shape (so it shards like the parameter) and one
float32 absmax per block of `block_size` values along the last dimension (padded with zeros inside
the computation only). Rounding is stochastic, from bits derived from the optimizer step, so the
stored moment is unbiased (a deterministic round would freeze `nu`: `0.999 * nu` rounds back to
`nu` in bfloat16 and in 8 bits) and the same step always rounds the same way (exact resume).

A large leaf is updated in pieces of rows (`map_pieces`): the per-block absmax reduction keeps XLA
from fusing the dequantize -> update -> requantize chain, so each step of it is a float32 array of
the piece's size, not of the leaf's. The rounding bits come from one key per row (its flat index
folded into the leaf's key), so a piece draws the bits the whole leaf would for its rows.
"""

from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp
from jax import lax

MU_LEVELS = 127  # signed int8 codes in [-127, 127]
NU_LEVELS = 255  # unsigned uint8 codes in [0, 255]


MIN_SIZE = 4096  # bitsandbytes' min_8bit_size: smaller leaves keep float32 moments
MIN_LAST_DIM = 32  # a block of fewer values costs 4 bytes of scale per 8 or fewer saved

# The float32 size of one piece of a leaf's 8-bit update. Unfused, the update holds about six
# float32 arrays of the piece at once (dequantized mu and nu, the new ones, the random bits, the
# step), so 64 MiB bounds its temporaries near 0.4 GiB on a 16 GiB chip, where Llama-3.2-3B's
# 394 M-value token table unchunked held 7.25 GiB; a piece of 64 MiB is still ~0.1 ms of memory
# traffic on a v5e, so the loop's few microseconds an iteration are noise.
CHUNK_BYTES = 64 * 2**20


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


def all_rows(lead: tuple[int, ...]) -> jax.Array:
    """The flat index of each row of a leaf whose leading dimensions are `lead` (uint32)."""
    return jnp.arange(math.prod(lead), dtype=jnp.uint32).reshape(lead)


def row_uniform(key: jax.Array, rows: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """Uniform floats of the blocked `shape` `(*rows.shape, blocks, block)`: row `r` draws from
    `fold_in(key, r)`, so any piece of rows draws the numbers the whole leaf draws for them."""
    draw = jax.vmap(lambda r: uniform(jax.random.fold_in(key, r), shape[-2:]))
    return draw(rows.reshape(-1)).reshape(shape)


def row_uniform_pair(key: jax.Array, rows: jax.Array, shape: tuple[int, ...]) -> tuple[jax.Array, jax.Array]:
    """Two arrays of uniform floats in [0, 1) of the blocked `shape` (as `row_uniform`'s), from one
    32-bit draw a value: its high 16 bits and its low 16 bits. Threefry's hash is most of the
    rounding's cost (~120 integer operations a 32-bit word), so `mu` and `nu` sharing a word
    halves it; 16 bits bias a rounding by at most 2**-17 of an 8-bit code's step."""
    draw = jax.vmap(lambda r: jax.random.bits(jax.random.fold_in(key, r), shape[-2:], jnp.uint32))
    bits = draw(rows.reshape(-1)).reshape(shape)
    scale = jnp.float32(2.0**-16)
    return ((bits >> 16).astype(jnp.float32) * scale, (bits & jnp.uint32(0xFFFF)).astype(jnp.float32) * scale)


# A piece takes its rows from GROUPS evenly spaced runs of the cut axis, so a mesh of 2, 4 or 8
# devices sharding that axis holds its share of every piece (a contiguous piece would live on one
# device, and XLA would gather the leaf to slice it). A run of a multiple of TILE rows (a TPU tile
# of int8 codes; float32's is 8) slices without relayout: strided single rows made XLA copy the
# whole leaf's codes and update into another layout (1.9 GiB for a 128256 x 3072 table).
GROUPS = 8
TILE = 32


def pieces(lead: tuple[int, ...], row_bytes: int,
           chunk_bytes: int) -> tuple[int, int, int] | None:
    """`(axis, groups, count)`: leading axis `axis` read as `(groups, count, run)` and cut into
    `count` pieces `[:, j, :]` of at most `chunk_bytes` (of one index of the axis when that is
    more); None when the leaf fits in one.

    The first leading axis that cuts into pieces small enough (into the fewest its size divides
    into: no ragged last piece) is cut, if the cut keeps whole tiles: an axis above the last
    leading one always does (a stacked leaf goes a layer or more at a time), the last one when
    its runs are whole TILEs. Failing that, the largest leading axis is cut as finely as needed."""
    total = math.prod(lead) * row_bytes
    if not lead or total <= chunk_bytes:
        return None

    def cuts(axis):  # (groups, count) that fit, fewest pieces first
        n = lead[axis]
        for count in (c for c in range(2, n + 1) if n % c == 0 and total <= c * chunk_bytes):
            yield (GROUPS if n // count % GROUPS == 0 else 1), count

    for axis in range(len(lead)):
        for groups, count in cuts(axis):
            if axis < len(lead) - 1 or lead[axis] // (groups * count) % TILE == 0:
                return axis, groups, count
    axis = max(range(len(lead)), key=lambda i: lead[i])
    groups, count = next(cuts(axis), (1, lead[axis]))
    return axis, groups, count


def map_pieces(fn: Callable[..., tuple[jax.Array, ...]], lead: tuple[int, ...],
               args: tuple[jax.Array, ...], row_bytes: int,
               chunk_bytes: int = CHUNK_BYTES, first_row: jax.Array | int = 0) -> tuple[jax.Array, ...]:
    """`fn(rows, *args)` (rows: `all_rows(lead) + first_row`) computed piece by piece of at most
    `chunk_bytes` (`first_row`: where the rows start in a larger leaf `args` are one slice of).

    Every array in `args` and out of `fn` has leading dimensions `lead`, and `fn` treats each row
    alone (a piece's leading dimensions may differ from `lead`). The pieces are a `fori_loop`
    writing its outputs in place, so XLA holds one piece's temporaries at a time."""
    rows = all_rows(lead) + jnp.asarray(first_row, jnp.uint32)
    cut = pieces(lead, row_bytes, chunk_bytes)
    if cut is None:
        return fn(rows, *args)
    axis, groups, count = cut

    def split(shape):  # axis of n -> (groups, count, run): piece j is [:, j, :]
        return (*shape[:axis], groups, count, shape[axis] // (groups * count), *shape[axis + 1:])

    def piece(x, j):
        return lax.dynamic_index_in_dim(x, j, axis + 1, keepdims=False)

    whole = [x.reshape(split(x.shape)) for x in (rows, *args)]
    shapes = jax.eval_shape(fn, *[piece(x, 0) for x in whole])
    outs = [jnp.zeros(split((*lead, *s.shape[len(lead) + 1:])), s.dtype) for s in shapes]

    def body(j, outs):
        done = fn(*[piece(x, j) for x in whole])
        return [lax.dynamic_update_index_in_dim(o, d, j, axis + 1) for o, d in zip(outs, done)]

    outs = lax.fori_loop(0, count, body, outs)
    return tuple(o.reshape(*lead, *o.shape[len(lead) + 2:]) for o in outs)


def to_bfloat16(x: jax.Array, key: jax.Array) -> jax.Array:
    """`x` (float32) rounded stochastically to bfloat16: random low 16 bits added, then cut."""
    bits = lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32)
    noise = jax.random.bits(key, x.shape, jnp.uint32) & jnp.uint32(0xFFFF)
    rounded = (bits + noise) & jnp.uint32(0xFFFF0000)
    return lax.bitcast_convert_type(rounded, jnp.float32).astype(jnp.bfloat16)


def quantize_mu(mu: jax.Array, key: jax.Array, block_size: int, rows: jax.Array | None = None,
                noise: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """Signed codes `round(127 * sign(q) * sqrt|q|)` of `q = mu / absmax` per block, and absmax.

    `rows` are the flat indices of `mu`'s rows in its leaf (`all_rows`: all of them), which the
    rounding's bits are drawn from; `noise`, the rounding's uniform numbers of the blocked shape
    when the caller drew them (`row_uniform_pair`: `key` and `rows` are then unused). The
    square-root map spends more codes near zero than a linear one: a value 1/16129 of its block's
    largest still gets a non-zero code (linear: 1/127)."""
    blocks = _blocks(mu.astype(jnp.float32), block_size)
    absmax = jnp.max(jnp.abs(blocks), axis=-1)
    q = blocks / jnp.where(absmax > 0, absmax, 1.0)[..., None]
    scaled = jnp.sqrt(jnp.abs(q)) * MU_LEVELS
    if noise is None:
        noise = row_uniform(key, all_rows(mu.shape[:-1]) if rows is None else rows, scaled.shape)
    codes = jnp.minimum(jnp.floor(scaled + noise), MU_LEVELS) * jnp.sign(q)
    return _unblocks(codes, mu.shape).astype(jnp.int8), absmax


def dequantize_mu(codes: jax.Array, absmax: jax.Array, block_size: int) -> jax.Array:
    c = _blocks(codes.astype(jnp.float32), block_size) / MU_LEVELS
    return _unblocks(jnp.sign(c) * c * c * absmax[..., None], codes.shape)


def quantize_nu(nu: jax.Array, key: jax.Array, block_size: int, rows: jax.Array | None = None,
                noise: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """Unsigned codes `round(255 * sqrt(r / absmax))` of `r = sqrt(nu)` per block, and absmax of r.

    `rows` and `noise` as `quantize_mu`'s.
    `nu` is kept as its fourth root: a value 2.4e-10 of its block's largest still gets a non-zero
    code, and a non-zero `nu` never gets code 0 (it would divide the update by `eps` alone)."""
    blocks = _blocks(jnp.sqrt(nu.astype(jnp.float32)), block_size)
    absmax = jnp.max(blocks, axis=-1)
    q = blocks / jnp.where(absmax > 0, absmax, 1.0)[..., None]
    scaled = jnp.sqrt(q) * NU_LEVELS
    if noise is None:
        noise = row_uniform(key, all_rows(nu.shape[:-1]) if rows is None else rows, scaled.shape)
    codes = jnp.minimum(jnp.floor(scaled + noise), NU_LEVELS)
    codes = jnp.where(q > 0, jnp.maximum(codes, 1.0), 0.0)
    return _unblocks(codes, nu.shape).astype(jnp.uint8), absmax


def dequantize_nu(codes: jax.Array, absmax: jax.Array, block_size: int) -> jax.Array:
    c = _blocks(codes.astype(jnp.float32), block_size) / NU_LEVELS
    r = c * c * absmax[..., None]
    return _unblocks(r * r, codes.shape)
