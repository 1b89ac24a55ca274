"""Adam whose moments are stored in float32, bfloat16 or 8 bits, and the `adam`/`adamw` built on it.

Each is an optax `GradientTransformation`: the moments are updated and the step computed in float32;
only what stays between steps (the state) is narrower. float32 is `optax.scale_by_adam` itself.
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from fitjax.optim import _blockwise

__all__ = ["ScaleByAdamBlockwiseState", "StackSlice", "adam", "adamw", "scale_by_adam"]

MOMENTS = ("float32", "bfloat16", "int8")


class StackSlice(NamedTuple):
    """What `update(..., stack_slice=...)` is given when its gradients are one slice of stacked
    leaves (`Trainer(update_in_backward=True)` updates one layer at a time): each leaf's number
    in the whole parameter tree, and the slice's index (a traced int32; None: the leaves are
    whole). The stochastic rounding then draws what the whole tree's update draws for those
    rows (8-bit; bfloat16: the leaf's key folded with the index), not the same bits in every layer.

    An optimizer of your own may read it the same way: `update(grads, state, params,
    stack_slice=None, **extra_args)` in an `optax.GradientTransformationExtraArgs`.

    Example:
        >>> import jax.numpy as jnp, fitjax as fj
        >>> tx = fj.optim.scale_by_adam(moments="int8")
        >>> grads = {"w": jnp.ones((64, 64))}            # layer 3's slice of a stacked [layers, 64, 64]
        >>> updates, state = tx.update(grads, tx.init(grads), stack_slice=fj.optim.StackSlice((5,), jnp.int32(3)))
        >>> state.mu["w"].dtype
        dtype('int8')
    """

    leaf_ids: tuple[int, ...]
    index: Any = None


def _slice_keys(count: jax.Array, n: int, seed: int, stack_slice: StackSlice | None) -> list[jax.Array]:
    """Two keys a leaf (`_keys`), by the leaves' numbers in the whole tree when given a slice."""
    if stack_slice is None:
        return _keys(count, 2 * n, seed)
    whole = _keys(count, 2 * (max(stack_slice.leaf_ids, default=0) + 1), seed)
    keys = [k for i in stack_slice.leaf_ids for k in (whole[2 * i], whole[2 * i + 1])]
    if stack_slice.index is not None:
        keys = [jax.random.fold_in(k, stack_slice.index) for k in keys]
    return keys


class ScaleByAdamBlockwiseState(NamedTuple):
    """Adam's state with 8-bit moments: `mu` int8 and `nu` uint8 codes shaped like the parameters
    (so they shard like them), and per leaf `{"absmax": float32 [*lead, blocks]}` scales (the
    extra key keeps a strategy from giving a scale its parameter's sharding). A leaf too small to
    quantize holds float32 moments and a `()` absmax."""

    count: jax.Array
    mu: Any
    nu: Any
    mu_absmax: Any
    nu_absmax: Any


def _check(moments: str, block_size: int) -> None:
    if moments not in MOMENTS:
        raise ValueError(f"moments={moments!r} is not one of {', '.join(map(repr, MOMENTS))}; "
                         "pick 'bfloat16' (half of float32 Adam's state) or 'int8' (about a quarter).")
    if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 1:
        raise ValueError(f"block_size={block_size!r} must be a positive int (the values sharing one "
                         "absmax scale along a parameter's last dimension; 256 is bitsandbytes')")


def _keys(count: jax.Array, n: int, seed: int) -> list[jax.Array]:
    # A function of the step alone: a resumed fit rounds exactly as the uninterrupted one.
    key = jax.random.fold_in(jax.random.key(seed), count)
    return [jax.random.fold_in(key, i) for i in range(n)]


def _step(b1: float, b2: float, eps: float, eps_root: float) -> Callable:
    """Adam's float32 step on trees (or single leaves) of gradients and moments."""

    def step(grads, mu, nu, count):
        """float32 moments after this step and the update they give."""
        mu = jax.tree.map(lambda g, m: b1 * m + (1 - b1) * g.astype(jnp.float32), grads, mu)
        nu = jax.tree.map(lambda g, v: b2 * v + (1 - b2) * jnp.square(g.astype(jnp.float32)), grads, nu)
        mu_hat = optax.tree.bias_correction(mu, b1, count)
        nu_hat = optax.tree.bias_correction(nu, b2, count)
        updates = jax.tree.map(lambda g, m, v: (m / (jnp.sqrt(v + eps_root) + eps)).astype(g.dtype),
                               grads, mu_hat, nu_hat)
        return mu, nu, updates

    return step


def scale_by_adam(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8, eps_root: float = 0.0, *,
                  moments: str = "float32", block_size: int = 256,
                  seed: int = 0) -> optax.GradientTransformation:
    """Rescale updates by Adam, keeping the moments in `moments` between steps.

    Args:
        b1: the first moment's decay, as `optax.scale_by_adam`.
        b2: the second moment's decay.
        eps: added to the root of the second moment (outside it).
        eps_root: added to the second moment inside the root.
        moments: how the two moments are stored. "float32": `optax.scale_by_adam` (8 bytes a
            parameter). "bfloat16": both moments in bfloat16 (4 bytes; optax's `mu_dtype` narrows
            only the first). "int8": 8-bit block-wise (2 bytes, plus 8 bytes of float32 scales per
            `block_size` values): `mu` as signed codes of `sign(x) * sqrt|x|` of its block's
            absmax-scaled values, `nu` as unsigned codes of its fourth root, so small values keep
            codes of their own (a non-linear map like bitsandbytes' dynamic one, with the same
            256-value blocks; a linear `nu` would round most of a block to 0 and divide those
            updates by `eps` alone). As bitsandbytes' `min_8bit_size`, a leaf with fewer than 4096
            values or a last dimension under 32 (biases, norm scales, a `Dense(1)` kernel) keeps
            float32 moments: its blocks would cost more in scales than they save. bfloat16 and
            int8 round stochastically (bits drawn from the step count and `seed`): `nu`'s
            `b2 = 0.999` decay is smaller than one bfloat16 step, and rounding to nearest would
            never let it decay.
        block_size: values per absmax scale along each parameter's last dimension ("int8" only;
            a shorter last dimension is one block).
        seed: the stochastic rounding's seed.

    Every moment is updated and the step computed in float32; the state is what is narrower.

    Example:
        >>> import jax.numpy as jnp
        >>> tx = scale_by_adam(moments="bfloat16")
        >>> state = tx.init({"w": jnp.zeros(3)})
        >>> state.nu["w"].dtype
        dtype(bfloat16)
    """
    _check(moments, block_size)
    if moments == "float32":
        return optax.scale_by_adam(b1, b2, eps, eps_root)

    step = _step(b1, b2, eps, eps_root)

    if moments == "bfloat16":
        def init(params):
            def zeros():  # two trees: one buffer in both would be donated twice
                return jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.bfloat16), params)

            return optax.ScaleByAdamState(count=jnp.zeros([], jnp.int32), mu=zeros(), nu=zeros())

        def update(grads, state, params=None, *, stack_slice: StackSlice | None = None, **extra_args):
            del params, extra_args
            count = optax.safe_increment(state.count)
            mu32 = jax.tree.map(lambda m: m.astype(jnp.float32), state.mu)
            nu32 = jax.tree.map(lambda v: v.astype(jnp.float32), state.nu)
            mu, nu, updates = step(grads, mu32, nu32, count)
            leaves, treedef = jax.tree.flatten(mu)
            keys = _slice_keys(count, len(leaves), seed, stack_slice)
            mu = treedef.unflatten([_blockwise.to_bfloat16(x, k) for x, k in zip(leaves, keys[0::2])])
            nu = treedef.unflatten([_blockwise.to_bfloat16(x, k) for x, k in
                                    zip(jax.tree.leaves(nu), keys[1::2])])
            return updates, optax.ScaleByAdamState(count=count, mu=mu, nu=nu)

        return optax.GradientTransformationExtraArgs(init, update)

    return _scale_by_adam_8bit(b1, b2, eps, eps_root, block_size, seed)


def _scale_by_adam_8bit(b1: float, b2: float, eps: float, eps_root: float, block_size: int, seed: int,
                        chunk_bytes: int = _blockwise.CHUNK_BYTES) -> optax.GradientTransformation:
    """`scale_by_adam(moments="int8")`; a leaf's update goes in pieces of at most `chunk_bytes` of
    float32 (`_blockwise.map_pieces`), which leaves it bitwise equal to one piece."""
    step = _step(b1, b2, eps, eps_root)

    def blocks(shape):  # the block size of an 8-bit leaf, None for one kept float32
        return _blockwise.block_for(shape, block_size)

    def init(params):
        def codes(p, dtype):
            return jnp.zeros(p.shape, dtype if blocks(p.shape) else jnp.float32)

        def scales(p):
            block = blocks(p.shape)
            shape = _blockwise.absmax_shape(p.shape, block) if block else ()
            return {"absmax": jnp.zeros(shape, jnp.float32)}

        return ScaleByAdamBlockwiseState(
            count=jnp.zeros([], jnp.int32),
            mu=jax.tree.map(lambda p: codes(p, jnp.int8), params),
            nu=jax.tree.map(lambda p: codes(p, jnp.uint8), params),
            mu_absmax=jax.tree.map(scales, params), nu_absmax=jax.tree.map(scales, params))

    def leaf_update(g, mu, mu_scale, nu, nu_scale, keys, count, index):
        """One leaf's update and its stored moments `(update, mu, mu_absmax, nu, nu_absmax)`.

        The state says how the leaf is stored (int8 codes or float32), not the gradient's size:
        a slice of a stacked leaf (`Trainer(update_in_backward=True)` updates one layer's at a
        time) keeps its stack's storage even where the slice alone would be under `MIN_SIZE`."""
        block = min(block_size, g.shape[-1]) if mu.dtype == jnp.int8 else None
        if not block:
            mu, nu, update = step(g, mu, nu, count)
            return update, mu, jnp.zeros((), jnp.float32), nu, jnp.zeros((), jnp.float32)

        def rows_update(rows, g, mu, mu_scale, nu, nu_scale):
            mu = _blockwise.dequantize_mu(mu, mu_scale, block)
            nu = _blockwise.dequantize_nu(nu, nu_scale, block)
            mu, nu, update = step(g, mu, nu, count)
            # one 32-bit draw a value rounds both moments: threefry's hash (~120 integer operations
            # a word) once, not twice; XLA:TPU's estimate of a 3072 x 8192 leaf's update on a v5e
            # fell from 7.2 to 5.5 ms (the random numbers no longer written out and read back)
            shape = (*g.shape[:-1], _blockwise.num_blocks(g.shape, block), block)
            mu_noise, nu_noise = _blockwise.row_uniform_pair(keys[0], rows, shape)
            return (update, *_blockwise.quantize_mu(mu, keys[0], block, rows, noise=mu_noise),
                    *_blockwise.quantize_nu(nu, keys[1], block, rows, noise=nu_noise))

        row_bytes = 4 * _blockwise.num_blocks(g.shape, block) * block  # a padded float32 row
        # a slice of a stacked leaf: its rows are those the whole leaf's update numbers them
        first_row = 0 if index is None else index.astype(jnp.uint32) * math.prod(g.shape[:-1])
        return _blockwise.map_pieces(rows_update, g.shape[:-1], (g, mu, mu_scale, nu, nu_scale),
                                     row_bytes, chunk_bytes, first_row)

    def update(grads, state, params=None, *, stack_slice: StackSlice | None = None, **extra_args):
        del params, extra_args
        count = optax.safe_increment(state.count)
        treedef = jax.tree.structure(grads)
        leaves = [treedef.flatten_up_to(tree) for tree in (
            grads, state.mu, state.mu_absmax, state.nu, state.nu_absmax)]
        # 8-bit: a slice draws from its whole leaf's key and rows (bitwise the whole update's bits)
        whole = None if stack_slice is None else stack_slice._replace(index=None)
        keys = _slice_keys(count, treedef.num_leaves, seed, whole)
        index = None if stack_slice is None else stack_slice.index
        done = [leaf_update(g, mu, mu_scale["absmax"], nu, nu_scale["absmax"], keys[2 * i:2 * i + 2],
                            count, index)
                for i, (g, mu, mu_scale, nu, nu_scale) in enumerate(zip(*leaves))]
        updates, mu, mu_absmax, nu, nu_absmax = (list(x) for x in zip(*done)) if done else ([],) * 5
        return treedef.unflatten(updates), ScaleByAdamBlockwiseState(
            count=count, mu=treedef.unflatten(mu), nu=treedef.unflatten(nu),
            mu_absmax=treedef.unflatten([{"absmax": s} for s in mu_absmax]),
            nu_absmax=treedef.unflatten([{"absmax": s} for s in nu_absmax]))

    return optax.GradientTransformationExtraArgs(init, update)


def adam(learning_rate: float | Callable, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
         eps_root: float = 0.0, *, moments: str = "float32") -> optax.GradientTransformation:
    """`optax.adam` with its moments stored as `moments` ("float32", "bfloat16" or "int8"; see
    `scale_by_adam`, which also takes the block size and the rounding's seed). "float32" is
    exactly `optax.adam`. Its only non-numeric option is `moments`, so
    `optax.inject_hyperparams(fj.optim.adam)(learning_rate=schedule, moments="int8")` (and
    `{"optimizer": fj.optim.adam, "lr_scheduler": schedule}`) drive its rate.

    Example:
        >>> import fitjax as fj
        >>> tx = fj.optim.adam(1e-3, moments="int8")
    """
    return optax.chain(scale_by_adam(b1, b2, eps, eps_root, moments=moments),
                       optax.scale_by_learning_rate(learning_rate))


def adamw(learning_rate: float | Callable, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
          eps_root: float = 0.0, weight_decay: float = 1e-4, mask: Any = None, *,
          moments: str = "float32") -> optax.GradientTransformation:
    """`optax.adamw` with its moments stored as `moments` ("float32", "bfloat16" or "int8"; see
    `scale_by_adam`): bitsandbytes' `AdamW8bit` is `moments="int8"`. "float32" is exactly
    `optax.adamw`; `optax.inject_hyperparams` drives it as `adam`.

    Example:
        >>> import fitjax as fj
        >>> tx = fj.optim.adamw(3e-4, weight_decay=0.1, moments="bfloat16")
    """
    return optax.chain(scale_by_adam(b1, b2, eps, eps_root, moments=moments),
                       optax.add_decayed_weights(weight_decay, mask),
                       optax.scale_by_learning_rate(learning_rate))
