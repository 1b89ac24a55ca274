"""Batches kept on the devices (DESIGN.md's "batches kept on device") for an in-memory `fj.DataLoader`.

A hand-written loop gathers each batch on the host and hands it to the jitted step, which copies
it to the device: two gathers and two transfers per step, on the critical path. When the train
data is a plain `fj.DataLoader` small enough to keep a copy on every device (`MAX_BYTES` in all),
the trainer instead

1. puts the data on the devices once per `fit`;
2. per block of up to `BLOCK_BYTES` of an epoch's full batches, sends that stretch of the epoch's
   order (row numbers) and gathers the block `[k, batch, ...]` on device in one call, sharded
   like the batch;
3. runs the train step on `(block, base)`: the step picks batch `state.step - base` from the
   block with a dynamic index, so the host does no per-step gather or transfer.

The batches and their order are the loader's own (same rows, same shuffle per epoch) and the
step computes the same numbers; a short last batch (`drop_last=False`) takes the host path.
On CPU this is done only for small steps (`CPU_STEP_FLOPS`): a larger step hides the host's
per-batch work behind its own compute, and there the step that picks from a block ran slower.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from fitjax._techniques import Chunk
from fitjax.data import DataLoader

__all__ = ["Feed", "block_sharding", "feed_for", "picking"]

MAX_BYTES = 1 << 30  # the data's bytes times the devices that each hold a copy
BLOCK_BYTES = 16 << 20  # one block of batches, gathered on device
CPU_STEP_FLOPS = 1 << 25  # ~1 ms on 2 CPU cores: larger steps take their batches from the host


def picking(step_fn: Callable) -> Callable:
    """`step_fn(state, batch)` as `train_step(state, (block, base))`: the batch is row
    `state.step - base` of the block."""

    def train_step(state, inputs):
        block, base = inputs
        index = state.step - base
        batch = jax.tree.map(lambda a: jax.lax.dynamic_index_in_dim(a, index, keepdims=False), block)
        return step_fn(state, batch)

    return train_step


def block_sharding(strategy) -> NamedSharding:
    """Blocks `[k, batch, ...]` are split over the devices like the batch, along their 2nd axis."""
    return NamedSharding(strategy.mesh, P(None, *strategy.batch_sharding.spec))


def _is_plain_loader(loader: Any) -> bool:
    """A `fj.DataLoader` whose batches are its rows as they are (no subclass changing them)."""
    return (
        isinstance(loader, DataLoader)
        and type(loader).__iter__ is DataLoader.__iter__
        and type(loader)._batches is DataLoader._batches
    )


def _step_is_small(params: Any, batch_size: int) -> bool:
    """Whether a CPU step is small enough for the host's per-step gather and copy to matter.

    Estimated as a dense net's `6 * parameters * batch` FLOPs (a lower bound for conv nets). Above
    `CPU_STEP_FLOPS` the host prepares the next batch while the device computes, so the host path
    costs nothing, while picking from a block measured 6-14% slower for the MNIST-sized MLP and
    the small CNN of `benchmarks/overhead.py` on XLA:CPU (the same program plus one slice).
    """
    parameters = sum(leaf.size for leaf in jax.tree.leaves(params))
    return 6 * parameters * batch_size <= CPU_STEP_FLOPS


def feed_for(loader: Any, strategy, *, plain_step: bool, params: Any) -> "Feed | None":
    """A `Feed` for `loader`, or None when its batches must come from the host: several processes,
    a step with accumulation or several steps per call, another kind of loader, data larger than
    `MAX_BYTES` across the devices, or (on CPU) a step too large for the host's work to matter."""
    if not plain_step or jax.process_count() != 1 or not _is_plain_loader(loader):
        return None
    if loader.num_examples < loader.batch_size:  # no full batch: nothing to keep on device
        return None
    if strategy.platform == "cpu" and not _step_is_small(params, loader.batch_size):
        return None
    nbytes = sum(leaf.nbytes for leaf in loader._leaves)
    if nbytes * strategy.mesh.size > MAX_BYTES:
        return None
    return Feed(loader, strategy)


class Feed:
    """The loader's data on the devices, and the per-epoch blocks gathered from it."""

    def __init__(self, loader: DataLoader, strategy) -> None:
        self.loader = loader
        self._data = jax.device_put(loader._leaves, strategy.replicated)
        batch, treedef = loader.batch_size, loader._treedef
        row_bytes = sum(leaf.nbytes // max(len(leaf), 1) for leaf in loader._leaves)
        self.block_batches = max(1, BLOCK_BYTES // max(row_bytes * batch, 1))

        def gather(data, rows):
            k = rows.shape[0] // batch
            return treedef.unflatten([jnp.take(a, rows, axis=0).reshape(k, batch, *a.shape[1:]) for a in data])

        self._gather = jax.jit(gather, out_shardings=block_sharding(strategy))
        # a fresh buffer holding the state's step (never the step array itself: that is donated)
        self._base = jax.jit(lambda step: step + jnp.zeros_like(step), out_shardings=strategy.replicated)

    def chunks(self, *, start: int, stop: int, current_step: Callable[[], jax.Array]) -> Iterator[Chunk]:
        """Batches `start..stop-1` of the loader's selected epoch: the full ones picked from device
        blocks (`Chunk.on_device`), a short last one as a host batch. `current_step()` is the
        state's step counter when a block's first batch is about to run."""
        epoch_order = self.loader._order()
        size = self.loader.batch_size
        full_stop = min(stop, len(epoch_order) // size)
        count = max(full_stop - start, 0)
        if count:
            blocks = math.ceil(count / self.block_batches)
            k = math.ceil(count / blocks)  # blocks of equal size; the last padded by < k batches
            for first in range(start, full_stop, k):
                n = min(k, full_stop - first)
                rows = epoch_order[first * size:(first + n) * size]
                padded = np.resize(rows, k * size).astype(np.int32)  # repeats rows; never stepped
                block = self._gather(self._data, padded)
                base = self._base(current_step())
                for j in range(n):
                    yield Chunk((block, base), 1, 1, full=True, rows=rows[j * size:(j + 1) * size], on_device=True)
        if stop > full_stop and full_stop * size < len(epoch_order):  # the short last batch
            rows = epoch_order[full_stop * size:]
            yield Chunk(self.loader._rows(rows), 1, 1, full=True)
