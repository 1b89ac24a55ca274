"""`fj.nn.attention` through JAX's Pallas TPU "splash" attention kernel, on one device or split
over the mesh the program is compiled for.

The kernel takes one example's [heads, length, head_dim] (fitjax's layout is [batch, length,
heads, head_dim]: transposed here, which XLA folds into the neighbouring matrix products) and is
vmapped over the batch. Its mask is static (causal, local window, or full, aligned as
`attention_mask` aligns them: the queries are the last positions of the keys'), the segment ids
are dynamic, and it has no `scale` argument: the queries are scaled before it, rounded once to
their dtype. Where the platform is not a TPU the same kernel runs in Pallas' interpreter (slow:
for tests on CPU). The kernel's residuals are named `RESIDUALS`, so a remat policy can keep them
(`jax.checkpoint_policies.save_only_these_names(RESIDUALS)`).

**Over a mesh (`mesh_layout`).** XLA cannot partition a Mosaic kernel (compiling it for more than
one device raises "Mosaic kernels cannot be automatically partitioned"), so where the program is
traced under a mesh of several devices (JAX's, `jax.sharding.get_abstract_mesh()`: the user's
`jax.set_mesh`, FSDP's with rules; else the strategy's, `fitjax._platform.traced_mesh()`: every
strategy's `jit`, the state's init and generation set it) the kernel runs inside `jax.shard_map`
over every axis of that mesh JAX has not made manual already (Mosaic compiles only where all are),
each device on its own examples and heads, with no collective:
- query, key, value `P(batch_axes, None, "tensor", None)`; the output like the query;
- segment ids `P(batch_axes, None)`;
where `batch_axes` are the mesh's `data` and `fsdp` axes (`FSDP.data_axes`; `DataParallel`'s
`data`) of more than one device, and "tensor" only where that axis has more than one. Grouped
key/value heads are split over `tensor` when their count divides by it, else repeated to the
query heads' count first (each device then holds its query heads' keys). The kernel is built
outside `shard_map` for one device's heads (`head_shards=1, q_seq_shards=1`: every head has the
same mask, so every device runs the same kernel) and closed over; its arrays are numpy, so it is
a constant of every program that calls it. Where the mesh cannot take the kernel (the batch not
divisible by the batch axes, the heads not by `tensor`) `attention` runs the plain path and says
so once per reason in the log.

What this layout costs where the model does not split its heads over `tensor` (parameters without
a "heads" -> "tensor" axis name, under fsdp × tensor): each layer's attention output is gathered
over `tensor` (a 2-layer `fitjax.models` Llama, width 256, its "heads", "kv_heads" and "mlp" ruled
to None, for `tpu-v5e-16` with fsdp 8 × tensor 2: 10.6 MB of collectives a step against 9.9 MB
with the plain path, as `fitjax.planner.collectives` counts them). Keeping the heads whole there
costs more (22.7 MB against 20.3 MB on `tpu-v5e-8`, counted when each of XLA:TPU's copies of a
collective was counted again): the Pallas call needs `check_vma=False` (its output
shapes carry no replication), and `shard_map` then sums over `tensor` the gradients of every input
it holds whole.

**Built outside every trace.** The kernel (its mask's block maps) is built once per shape and
mask and cached. `make_splash_mha` turns its numpy block maps into `jnp` arrays; built while a
model is traced under Flax's `nn.scan` (which traces the body with JAX's partial evaluation,
`JaxprTrace`, where `jax.ensure_compile_time_eval` folds nothing) those were tracers, which the
cache then leaked into the next trace (`UnexpectedTracerError`). So it is built on a thread of its
own, where no trace is active (JAX's trace state is per thread), and its arrays kept as numpy.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from fitjax._platform import traced_mesh
from fitjax.nn._kernels import SplashBlocks

__all__ = ["BATCH_AXES", "HEAD_AXIS", "RESIDUALS", "Layout", "mesh_layout", "splash_attention"]

RESIDUALS = "fitjax_attention"
#: mesh axes the batch is split over (`fitjax.strategies.FSDP.data_axes`; `DataParallel` has "data")
BATCH_AXES = ("data", "fsdp")
#: the mesh axis attention heads are split over (`FSDP(tensor=...)`)
HEAD_AXIS = "tensor"

log = logging.getLogger("fitjax")
_SAID: set[str] = set()


class Layout(NamedTuple):
    """How the kernel is split over a mesh: `shard_map`'s manual axes, the axes the batch is split
    over, the head axis (None: heads whole), and whether grouped key/value heads are repeated."""

    mesh: Any  # jax.sharding.Mesh or AbstractMesh
    manual: frozenset[str]
    batch: tuple[str, ...]
    heads: str | None
    repeat_kv: bool


def mesh_layout(batch: int, heads: int, kv_heads: int) -> tuple[Layout | None, str]:
    """(the layout over the mesh being traced under, None where the kernel is called as is (no
    mesh, one device); why the mesh cannot take the kernel, "" where it can)."""
    mesh = jax.sharding.get_abstract_mesh()  # the user's `jax.set_mesh`, a shard_map's, FSDP(rules=...)'s
    if mesh.empty:
        mesh = traced_mesh()  # the strategy's whose program this is
        if mesh is None:
            return None, ""
    if mesh.size == 1:
        return None, ""
    already = mesh.abstract_mesh.manual_axes if isinstance(mesh, jax.sharding.Mesh) else mesh.manual_axes
    manual = frozenset(name for name in mesh.axis_names if name not in already)
    if not manual:  # inside the user's own shard_map over every axis: a per-device call
        return None, ""
    split = tuple(name for name in BATCH_AXES if name in manual and mesh.shape[name] > 1)
    shards = math.prod(mesh.shape[name] for name in split)
    if batch % shards:
        return None, (f"a batch of {batch} rows does not divide over the mesh's {'×'.join(split)} axes "
                      f"({shards} devices)")
    head_axis = HEAD_AXIS if HEAD_AXIS in manual and mesh.shape[HEAD_AXIS] > 1 else None
    tensor = mesh.shape[head_axis] if head_axis else 1
    if heads % tensor:
        return None, f"{heads} heads do not divide over the mesh's {HEAD_AXIS} axis ({tensor} devices)"
    return Layout(mesh, manual, split, head_axis, kv_heads % tensor != 0), ""


def say_once(reason: str) -> None:
    """Logs, once per process and reason, that attention runs the plain path here."""
    if reason not in _SAID:
        _SAID.add(reason)
        log.warning("fj.nn.attention runs the plain path instead of the TPU kernel: %s", reason)


def _outside_traces(build: Callable[[], Any]) -> Any:
    # JAX's trace state is per thread: a fresh thread traces nothing, so `jnp` values are concrete
    result: list[Any] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            result.append(build())
        except BaseException as error:  # re-raised on the caller's thread
            errors.append(error)

    thread = threading.Thread(target=run, name="fitjax-splash-kernel")
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return result[0]


@functools.lru_cache(maxsize=64)
def _kernel(heads: int, q_length: int, kv_length: int, causal: bool, sliding_window: int | None,
            logit_softcap: float | None, blocks: SplashBlocks, interpret: bool):
    from jax.experimental.pallas.ops.tpu import splash_attention as splash

    shape, offset = (q_length, kv_length), kv_length - q_length
    if sliding_window is not None:  # keys above `position - window`, and (causal) none after it
        mask = splash.LocalMask(shape, window_size=(sliding_window - 1, 0 if causal else None), offset=offset)
    elif causal:
        mask = splash.CausalMask(shape, offset=offset)
    else:
        mask = splash.FullMask(shape)
    fused = blocks.fused_backward
    sizes = splash.BlockSizes(
        block_q=blocks.q, block_kv=blocks.kv, block_kv_compute=blocks.kv,
        block_q_dkv=blocks.q, block_kv_dkv=blocks.kv, block_kv_dkv_compute=blocks.kv,
        block_q_dq=None if fused else blocks.q, block_kv_dq=None if fused else blocks.kv,
        use_fused_bwd_kernel=fused)

    def build():
        return splash.make_splash_mha(splash.MultiHeadMask([mask] * heads), block_sizes=sizes, head_shards=1,
                                      q_seq_shards=1, attn_logits_soft_cap=logit_softcap,
                                      residual_checkpoint_name=RESIDUALS, interpret=interpret)

    # numpy leaves: a constant in every program, whatever trace the first call was made in
    return jax.tree.map(np.asarray, _outside_traces(build))


def splash_attention(query: jax.Array, key: jax.Array, value: jax.Array, *, causal: bool,
                     segment_ids: jax.Array | None, sliding_window: int | None, logit_softcap: float | None,
                     scale: float | None, blocks: SplashBlocks, interpret: bool,
                     layout: Layout | None = None) -> jax.Array:
    """`fj.nn.attention` for the kernel's cases (`segment_ids` one array for queries and keys;
    grouped-query heads as they come: the kernel maps each query head to its key head), inside
    `shard_map` over `layout`'s mesh when one is given (`mesh_layout`)."""
    from jax.experimental.pallas.ops.tpu.splash_attention import SegmentIds

    batch, q_length, heads, head_dim = query.shape
    tensor = layout.mesh.shape[layout.heads] if layout is not None and layout.heads else 1
    kernel = _kernel(heads // tensor, q_length, key.shape[1], causal, sliding_window, logit_softcap, blocks,
                     interpret)
    scale = head_dim ** -0.5 if scale is None else scale
    query = (query.astype(jnp.float32) * scale).astype(query.dtype)

    def per_device(q, k, v, ids):  # [batch, length, heads, head_dim] of one device
        q, k, v = q.swapaxes(1, 2), k.swapaxes(1, 2), v.swapaxes(1, 2)
        if ids is None:
            out = jax.vmap(kernel)(q, k, v)
        else:
            ids = ids.astype(jnp.int32)
            out = jax.vmap(lambda q, k, v, ids: kernel(q, k, v, segment_ids=SegmentIds(ids, ids)))(q, k, v, ids)
        return out.swapaxes(1, 2)

    if layout is None:
        return per_device(query, key, value, segment_ids)
    if layout.repeat_kv:  # kv heads not divisible over `tensor`: each query head gets its own copy
        key, value = (jnp.repeat(x, heads // key.shape[2], axis=2) for x in (key, value))
    rows = layout.batch or None
    heads_spec = P(rows, None, layout.heads, None)
    ids_spec = P(rows, None)
    # check_vma off: the Pallas call has no replication rule; every output is split as out_specs say
    if segment_ids is None:
        return jax.shard_map(lambda q, k, v: per_device(q, k, v, None), mesh=layout.mesh, axis_names=layout.manual,
                             check_vma=False, in_specs=(heads_spec,) * 3, out_specs=heads_spec)(query, key, value)
    return jax.shard_map(per_device, mesh=layout.mesh, axis_names=layout.manual, check_vma=False,
                         in_specs=(heads_spec,) * 3 + (ids_spec,), out_specs=heads_spec)(query, key, value, segment_ids)
