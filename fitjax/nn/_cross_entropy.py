"""`chunked_cross_entropy`: a language model's output layer and its cross-entropy, computed a
chunk of tokens at a time so the float32 logits [batch, length, vocab] never exist whole.

The plain way (`logits = hidden @ embedding.T`, then `optax.softmax_cross_entropy...`) keeps
the float32 logits for the backward pass and makes a second array of their size for their
gradient: for GPT-2 small's vocabulary (50,304) at 16 rows of 1,024 tokens, 3.3 GB each, the
largest buffers of the step. Here the length is cut into chunks of `chunk_size` positions; each
chunk's logits [batch, chunk_size, vocab] are computed, reduced to the chunk's loss, and dropped. The
gradient is computed in the same pass (a custom VJP): for a chunk, d loss / d logits is
`softmax - one_hot(target)` (times the token's mask), so the hidden states' gradient
(`dlogits @ embedding`) and the embedding's (`dlogits.T @ hidden`, summed over chunks in
float32) come from the logits while they are live. Memory: one chunk's logits and their
gradient (2 x batch x chunk_size x vocab x 4 bytes: 0.8 GB at 16 rows, 256 positions and
GPT-2's vocabulary) instead of two [batch, length, vocab] arrays, plus the hidden states' gradient [tokens, width] and a
float32 [vocab, width] accumulator kept from the forward pass to the backward one. Compute: the
same three matrix products as the plain way (logits, and the two gradients), none repeated; a
call that is not differentiated (evaluation) computes only the logits.

**Over a mesh.** Left to XLA's partitioner, the loop over chunks under a batch sharded over
devices and an embedding sharded over `fsdp` gathers the embedding again in every chunk and
all-reduces the float32 [vocab, width] gradient accumulator in every chunk (a 2-layer
Llama-3.1-8B for `tpu-v5e-16` with fsdp, 256 positions a chunk: 16.5 GiB of all-gathers and 31.3
GiB in 20 all-reduces a chip a step, docs/guides/plan.md). So where the call is traced under a
mesh (as `fj.nn.attention` finds it: `jax.sharding.get_abstract_mesh()`, else the strategy's
`fitjax._platform.traced_mesh()`) whose batch axes (`data`, `fsdp`) hold more than one device and divide the batch, the loop runs
inside `jax.shard_map` over those axes: each device loops over its own rows with the embedding
whole (gathered once, at the `shard_map`'s boundary), and the loss and the embedding's gradient
are summed over the devices once, after the loop, as the plain way sums them (that model: 1.82
GiB of all-gathers and 0.98 GiB in 5 all-reduces, at 256 positions a chunk as at 4096). Other
axes (`tensor`) stay XLA's. A batch the axes do not divide takes the partitioner's way. On CPU a
bfloat16 gradient is summed over the devices in float32 (`_psum`: XLA:CPU aborts on the other).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from fitjax._platform import traced_mesh
from fitjax.nn._splash import BATCH_AXES
from fitjax.step.token_loss import TokenLoss

__all__ = ["chunked_cross_entropy"]


def chunked_cross_entropy(hidden: jax.Array, embedding: jax.Array, targets: jax.Array, *,
                          mask: jax.Array | None = None, chunk_size: int = 256,
                          logit_softcap: float | None = None) -> TokenLoss:
    """Softmax cross-entropy of the logits `hidden @ embedding.T` against `targets`, as the
    `TokenLoss` of its sum over the tokens and their count, without the whole logits in memory
    (module docstring).

    Args:
        hidden: the final hidden states, [batch, length, width].
        embedding: the output layer's weights as [vocab, width]: a tied model's token embedding
            table as it is (`nn.Embed`'s `embedding`). An untied Dense kernel [width, vocab] is
            passed as `kernel.T` (free under jit: XLA folds it into the product).
        targets: int [batch, length], the token each position should predict.
        mask: [batch, length], 1 where a token counts and 0 for padding; fractional values
            weigh a token's loss. None: every token counts.
        chunk_size: positions of the length per chunk (the last chunk padded): one chunk's
            float32 logits [batch, chunk_size, vocab] are the largest array made. Each chunk
            holds every row, so a batch sharded over devices stays sharded; under a mesh each
            device loops over its own rows (module docstring).
        logit_softcap: logits become `cap * tanh(logits / cap)` (Gemma 2).

    Returns:
        `TokenLoss(sum=..., count=...)`: return it from `loss` (exact under gradient
        accumulation) or use `.mean`. The gradients equal the plain computation's.

    Example:
        >>> import jax, jax.numpy as jnp, fitjax as fj
        >>> hidden = jnp.ones((2, 16, 8))
        >>> embedding = jax.random.normal(jax.random.key(0), (256, 8))
        >>> targets = jnp.zeros((2, 16), int)
        >>> loss = fj.nn.chunked_cross_entropy(hidden, embedding, targets, chunk_size=8)
        >>> float(loss.count), loss.mean.shape
        (32.0, ())
    """
    _check(hidden, embedding, targets, mask, chunk_size)
    batch, length, width = hidden.shape
    weights = jnp.ones((batch, length), jnp.float32) if mask is None else mask.astype(jnp.float32)
    chunk = min(chunk_size, length)
    pad = -length % chunk  # padded positions weigh 0
    chunks = (length + pad) // chunk

    def split(x: jax.Array) -> jax.Array:  # [batch, length, ...] -> [chunks, batch, chunk, ...]
        x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
        return x.reshape(batch, chunks, chunk, *x.shape[2:]).swapaxes(0, 1)

    args = (split(hidden), embedding, split(targets.astype(jnp.int32)), split(weights))
    split_over = _batch_split(batch)
    if split_over is None:
        total = _loss_sum(*args, logit_softcap, ())
    else:
        mesh, rows = split_over
        chunked_rows = P(None, rows)  # [chunks, batch, chunk, ...]: the batch split, the rest as it is
        # the embedding enters whole (P(): gathered once); its gradient is summed over the batch
        # axes once, after the loop (`_loss_sum_bwd`), the loss here
        if any(t == jax.sharding.AxisType.Explicit for t in getattr(mesh, "axis_types", ())):
            # explicit axes: shard_map takes arrays laid out as its specs say (the hidden states'
            # width replicated over `tensor` here)
            args = tuple(jax.sharding.reshard(x, spec) for x, spec in zip(args, (chunked_rows, P(), chunked_rows,
                                                                               chunked_rows)))
        total = jax.shard_map(lambda h, e, t, w: jax.lax.psum(_loss_sum(h, e, t, w, logit_softcap, rows), rows),
                              mesh=mesh, axis_names=frozenset(rows), in_specs=(chunked_rows, P(), chunked_rows,
                                                                              chunked_rows),
                              out_specs=P())(*args)
    return TokenLoss(sum=total, count=weights.sum())


def _batch_split(batch: int) -> tuple[object, tuple[str, ...]] | None:
    """(the mesh being traced under, its batch axes the loop is split over: `BATCH_AXES`, as
    `fj.nn.attention` splits its batch), or None: no mesh, no batch axis of more than one device that JAX has not made manual already, or a batch they do
    not divide."""
    mesh = jax.sharding.get_abstract_mesh()  # the user's `jax.set_mesh`, a shard_map's, FSDP(rules=...)'s
    if mesh.empty:
        mesh = traced_mesh()  # the strategy's whose program this is
        if mesh is None:
            return None
    if mesh.size == 1:
        return None
    manual = mesh.abstract_mesh.manual_axes if isinstance(mesh, jax.sharding.Mesh) else mesh.manual_axes
    rows = tuple(name for name in BATCH_AXES
                 if name in mesh.axis_names and name not in manual and mesh.shape[name] > 1)
    if not rows or batch % math.prod(mesh.shape[name] for name in rows):
        return None
    return mesh, rows


def _check(hidden, embedding, targets, mask, chunk_size) -> None:
    if (hidden.ndim != 3 or hidden.shape[:-1] != targets.shape or embedding.ndim != 2
            or embedding.shape[1] != hidden.shape[-1]):
        raise ValueError(f"chunked_cross_entropy(hidden, embedding, targets): expected hidden [batch, length, width], "
                         f"embedding [vocab, width] (an untied [width, vocab] kernel as `kernel.T`) and targets "
                         f"[batch, length]; got hidden {hidden.shape}, embedding {embedding.shape}, targets "
                         f"{targets.shape}")
    if mask is not None and mask.shape != targets.shape:
        raise ValueError(f"chunked_cross_entropy(mask=...): expected the targets' shape {targets.shape}; got {mask.shape}")
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunked_cross_entropy(chunk_size={chunk_size!r}) must be a positive int (positions of "
                         f"the length per chunk), e.g. 256")


def _chunk_logits(h: jax.Array, embedding: jax.Array, softcap: float | None):
    """(logits as the loss sees them, d logits / d raw logits or None), float32."""
    raw = jnp.einsum("bcw,vw->bcv", h, embedding, preferred_element_type=jnp.float32)
    if softcap is None:
        return raw, None
    capped = jnp.tanh(raw / softcap)
    return softcap * capped, 1.0 - capped * capped


def _chunk_loss(logits: jax.Array, t: jax.Array, w: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(the chunk's weighted loss sum, each token's log-sum-exp)."""
    lse = jax.nn.logsumexp(logits, axis=-1)
    picked = jnp.where(_is_target(logits, t), logits, 0.0).sum(-1)  # a fused select, not a gather
    return ((lse - picked) * w).sum(), lse


def _is_target(logits: jax.Array, t: jax.Array) -> jax.Array:
    return jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1) == t[..., None]


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _loss_sum(h, embedding, t, w, softcap, rows):
    def body(total, chunk):
        h_c, t_c, w_c = chunk
        logits, _ = _chunk_logits(h_c, embedding, softcap)
        return total + _chunk_loss(logits, t_c, w_c)[0], None

    return jax.lax.scan(body, _per_device(jnp.zeros((), jnp.float32), rows), (h, t, w))[0]


def _loss_sum_fwd(h, embedding, t, w, softcap, rows):
    dtype = jnp.result_type(h.dtype, embedding.dtype)

    def body(carry, chunk):
        total, d_embedding = carry
        h_c, t_c, w_c = chunk
        logits, d_cap = _chunk_logits(h_c, embedding, softcap)
        loss, lse = _chunk_loss(logits, t_c, w_c)
        # d loss / d logits: softmax - one_hot(target), per token times its weight
        probs = jnp.exp(logits - lse[..., None])
        d_logits = jnp.where(_is_target(logits, t_c), probs - 1.0, probs) * w_c[..., None]
        if d_cap is not None:
            d_logits = d_logits * d_cap
        d_logits = d_logits.astype(dtype)  # the products run in the inputs' dtype, as autodiff's would
        d_h = jnp.einsum("bcv,vw->bcw", d_logits, embedding, preferred_element_type=jnp.float32).astype(h.dtype)
        d_embedding = d_embedding + jnp.einsum("bcv,bcw->vw", d_logits, h_c, preferred_element_type=jnp.float32)
        return (total + loss, d_embedding), d_h

    start = (_per_device(jnp.zeros((), jnp.float32), rows), _per_device(jnp.zeros(embedding.shape, jnp.float32), rows))
    (total, d_embedding), d_h = jax.lax.scan(body, start, (h, t, w))
    return total, (d_h, d_embedding.astype(embedding.dtype), t, w)


def _loss_sum_bwd(softcap, rows, residuals, g):
    d_h, d_embedding, t, w = residuals
    d_embedding = (g * d_embedding).astype(d_embedding.dtype)
    if rows:  # inside `shard_map` over the batch axes `rows`: each device's rows' share, summed once
        d_embedding = _psum(d_embedding, rows)
    return (g * d_h).astype(d_h.dtype), d_embedding, None, None


_loss_sum.defvjp(_loss_sum_fwd, _loss_sum_bwd)


def _psum(x: jax.Array, rows: tuple[str, ...]) -> jax.Array:
    """`lax.psum(x, rows)`; a bfloat16 `x` summed in float32 on CPU.

    XLA:CPU rewrites a bfloat16 all-reduce into a float32 one (its `AllReducePromotion` pass,
    bfloat16 only) by cloning the reduction's root as a binary op, and JAX builds the reduction
    of a `psum` inside a `shard_map` manual over some of the mesh's axes only (here the batch
    axes: `tensor` stays XLA's) with a sharding annotation at its root, which becomes a `copy`:
    the compile aborts the process ("Invalid binary instruction opcode copy", jax 0.10.2; six
    lines reproduce it: bfloat16 `psum` over `fsdp` in `shard_map(axis_names={"fsdp"})` on an
    (`fsdp`=2, `tensor`=1) mesh, jitted on 2 CPU devices). Summing in float32 on CPU is the
    program that pass would have made; TPU and GPU (whose pass promotes 16-bit integers only)
    keep the bfloat16 all-reduce, half the bytes.
    """
    if x.dtype != jnp.bfloat16:
        return jax.lax.psum(x, rows)
    return jax.lax.platform_dependent(
        x, cpu=lambda x: jax.lax.psum(x.astype(jnp.float32), rows).astype(x.dtype),
        default=lambda x: jax.lax.psum(x, rows))


def _per_device(zeros: jax.Array, rows: tuple[str, ...]) -> jax.Array:
    """`zeros` as a value of each device's own inside `shard_map` over the batch axes `rows`
    (a loop's sums start as the per-device values they become); as it is elsewhere."""
    return jax.lax.pcast(zeros, rows, to="varying") if rows else zeros
