"""Batches kept on the devices (DESIGN.md's "batches kept on device") for an in-memory `fj.DataLoader`.

A hand-written loop gathers each batch on the host and hands it to the jitted step, which copies
it to the device: two gathers and two transfers per step, on the critical path. When the train
data is a plain `fj.DataLoader` small enough to keep a copy on every device (`MAX_BYTES` in all),
the trainer instead

1. puts the data on the devices once per `fit`;
2. per block of up to `BLOCK_BYTES` of an epoch's full batches, sends that stretch of the epoch's
   order (row numbers) and gathers the block `[n, batch, ...]` on device in one call, sharded
   like the batch;
3. runs the train step on `(block, base, count)`: the step picks its batches (one, or the
   `accumulate_grad_batches * steps_per_execution` of a full call) from the block with a dynamic
   slice at `state.step - base` (`fitjax.step.train.picking`), so the host does no per-step
   gather or transfer; `count` of them are real (all but in an epoch's last accumulation group).

The batches and their order are the loader's own (same rows, same shuffle per epoch) and the
step computes the same numbers. With one step per call, an epoch's last accumulation group of
fewer than `accumulate_grad_batches` batches is one more call of the same program, masked as the
host path masks it: a fit compiles one train step, not a second one for that group (~40 s for
GPT-2 small on a TPU chip). A short last batch (`drop_last=False`: another shape) and, with
`steps_per_execution > 1`, an epoch's leftover steps take the host path (one more program).
On CPU this is done only for small steps (`CPU_STEP_FLOPS`): a larger step hides the host's
per-batch work behind its own compute, and there the step that picks from a block ran slower.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterator, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fitjax.data._loader import DataLoader
from fitjax.step import StepInputs, StepOptions, compiling, group_batches
from fitjax.step.jitted import block_sharding

__all__ = ["Feed", "feed_for"]

MAX_BYTES = 1 << 30  # the data's bytes times the devices that each hold a copy
BLOCK_BYTES = 16 << 20  # one block of batches, gathered on device
CPU_STEP_FLOPS = 1 << 25  # ~1 ms on 2 CPU cores: larger steps take their batches from the host


def _is_plain_loader(loader: Any) -> bool:
    """A `fj.DataLoader` whose batches are its rows as they are, in its own order (no subclass
    changing them: each run's order, `fitjax.runs.RunOrders`, stays on the host)."""
    return (
        isinstance(loader, DataLoader)
        and type(loader).__iter__ is DataLoader.__iter__
        and type(loader)._batches is DataLoader._batches
        and type(loader)._order is DataLoader._order
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


def feed_for(loader: Any, strategy, *, options: StepOptions, params: Any) -> "Feed | None":
    """A `Feed` for `loader`, or None when its batches must come from the host: several processes,
    another kind of loader, data larger than `MAX_BYTES` across the devices, or (on CPU) a step
    too large for the host's work to matter."""
    if jax.process_count() != 1 or not _is_plain_loader(loader):
        return None
    if loader.num_examples < loader.batch_size:  # no full batch: nothing to keep on device
        return None
    if strategy.platform == "cpu" and not _step_is_small(params, loader.batch_size):
        return None
    nbytes = sum(leaf.nbytes for leaf in loader._leaves)
    if nbytes * strategy.mesh.size > MAX_BYTES:
        return None
    return Feed(loader, strategy, options)


class _Stretch(NamedTuple):
    """The calls of a stretch of an epoch that run on device blocks."""

    rows: np.ndarray  # their rows, call after call (a last accumulation group's padded to k batches)
    counts: list[int]  # real batches per call: `batches_per_call`, or fewer in the last group
    block: int  # batches per block (whole calls), the same for every stretch of the epoch


class Feed:
    """The loader's data on the devices, and the per-epoch blocks gathered from it."""

    def __init__(self, loader: DataLoader, strategy, options: StepOptions) -> None:
        self.loader = loader
        self.options = options
        self._data = jax.device_put(loader._leaves, strategy.replicated)
        batch, treedef = loader.batch_size, loader._treedef
        row_bytes = sum(leaf.nbytes // max(len(leaf), 1) for leaf in loader._leaves)
        per_call = options.batches_per_call
        calls = max(1, BLOCK_BYTES // max(row_bytes * batch * per_call, 1))
        self.block_batches = calls * per_call  # a block holds whole calls

        def gather(data, rows):
            k = rows.shape[0] // batch
            return treedef.unflatten([jnp.take(a, rows, axis=0).reshape(k, batch, *a.shape[1:]) for a in data])

        self._gather = compiling.jit(strategy, gather, out_shardings=block_sharding(strategy))
        # a fresh buffer holding the state's step (never the step array itself: that is donated)
        self._base = compiling.jit(strategy, lambda step: step + jnp.zeros_like(step), out_shardings=strategy.replicated)
        # each call's count of real batches, put on the devices once (at most k + 1 values a fit)
        self._counts = _Counts(strategy.replicated)
        self._next: tuple[int, np.ndarray, Any] | None = None  # `(k, rows, block)` gathered ahead
        self._orders: dict[tuple, np.ndarray] = {}  # the epochs' orders drawn last (`_order`)

    def chunks(self, *, start: int, stop: int, steps_left: int | None,
               current_step: Callable[[], jax.Array]) -> Iterator[StepInputs]:
        """Batches `start..stop-1` of the loader's selected epoch, at most `steps_left` optimizer
        steps: whole calls picked from device blocks (`StepInputs.on_device`), and with
        `steps_per_execution == 1` the epoch's last accumulation group of fewer than k full
        batches too; the rest (a short last batch, leftover steps of several-step calls) as
        host batches. `current_step()` is the state's step counter when a block's first call is
        about to run."""
        epoch_order = self._order(self.loader._epoch)
        size, options = self.loader.batch_size, self.options
        stretch = self._stretch(epoch_order, start=start, stop=stop, steps_left=steps_left)
        call_rows = options.batches_per_call * size
        last = None
        for counts, rows in self._blocks(stretch):
            last = (stretch.block, rows, self._block(rows, stretch.block))
            base = self._base(current_step())
            # what each call takes, made before its steps: no Python call per step
            # (`tests/loop/test_host_cost.py` counts them), a call's steps once per count
            steps = {count: self._steps(count) for count in set(counts)}
            calls = [((last[2], base, self._counts[count]), count, steps[count]) for count in counts]
            for j, (inputs, count, steps) in enumerate(calls):
                yield StepInputs(inputs, count, steps, full=True, rows=rows[j * call_rows:(j + 1) * call_rows],
                                 on_device=True)
        if last is not None:  # every call of the epoch's blocks is dispatched
            self._prefetch(stop, last)
        if steps_left is not None:
            steps_left -= sum(map(self._steps, stretch.counts))
        rest = epoch_order[(start + sum(stretch.counts)) * size:stop * size]
        host = (self.loader._rows(rest[i:i + size]) for i in range(0, len(rest), size))
        yield from group_batches(host, options, steps_left=steps_left)

    def _stretch(self, order: np.ndarray, *, start: int, stop: int, steps_left: int | None) -> _Stretch:
        """The calls of batches `start..stop-1` (of an epoch ordered `order`) that run on device
        blocks: its whole calls, then (one step a call) a last group of fewer than k batches,
        padded as `group_batches` pads it (its last batch repeated, never stepped), so that it
        runs in the block step too instead of compiling the host step (~40 s for GPT-2 small on
        a TPU chip). With several steps per call, the leftover steps keep the host's one-step
        program: a block call always takes `steps_per_execution` steps.

        A block's size depends only on the epoch's length, never on where the stretch starts or
        stops: the block is an input of the train step, so a stretch cut short (`max_steps`, a
        resume mid-epoch) that gathered a smaller block would compile the step again."""
        size, per_call = self.loader.batch_size, self.options.batches_per_call
        k, spe = self.options.accumulate_grad_batches, self.options.steps_per_execution
        epoch_batches = len(order) // size  # whole batches
        batches = max(min(stop, epoch_batches) - start, 0)
        calls = batches // per_call
        if steps_left is not None:
            calls = min(calls, steps_left // spe)
        group = batches - calls * per_call if spe == 1 and (steps_left is None or steps_left > calls) else 0
        counts = [per_call] * calls + ([group] if group else [])
        if not counts:
            return _Stretch(order[:0], [], 0)
        end = start + calls * per_call
        rows = order[start * size:end * size]
        if group:
            last = order[(end + group - 1) * size:(end + group) * size]
            rows = np.concatenate([rows, order[end * size:(end + group) * size], np.tile(last, k - group)])
        # the epoch's calls, a last group's included, in equal blocks
        epoch_calls = math.ceil(epoch_batches / k) if spe == 1 else epoch_batches // per_call
        blocks = math.ceil(epoch_calls * per_call / self.block_batches)
        return _Stretch(rows, counts, math.ceil(epoch_calls / blocks) * per_call)

    def _order(self, epoch: int) -> np.ndarray:
        """The loader's order of `epoch` (`DataLoader._order`), drawn once: `_prefetch` draws the
        next epoch's, which that epoch's `chunks` reuses (a permutation of the tiny MLP's 32,768
        rows is ~0.3 ms of host time, ~10 µs of each of its epoch's 32 calls at 32 steps a call)."""
        loader = self.loader
        key = (epoch, loader.shuffle, loader.seed)
        order = self._orders.get(key)
        if order is None:
            order = loader._order(epoch)
            self._orders = {k: v for k, v in self._orders.items() if k[0] == epoch - 1}  # this and the last
            self._orders[key] = order
        return order

    def _steps(self, count: int) -> int:
        """Optimizer steps of a call of `count` batches: a full call's, or a last group's one."""
        return self.options.steps_per_execution if count == self.options.batches_per_call else 1

    def _blocks(self, stretch: _Stretch) -> Iterator[tuple[list[int], np.ndarray]]:
        """Each block's `(counts, rows)`: up to `stretch.block` batches of whole calls."""
        per_block = stretch.block // max(self.options.batches_per_call, 1)
        call_rows = self.options.batches_per_call * self.loader.batch_size
        for first in range(0, len(stretch.counts), max(per_block, 1)):
            counts = stretch.counts[first:first + per_block]
            yield counts, stretch.rows[first * call_rows:(first + len(counts)) * call_rows]

    def _block(self, rows: np.ndarray, k: int) -> Any:
        """The block `[k, batch, ...]` of `rows` (padded by repeating them: those are never
        stepped): the one `_prefetch` gathered if it holds these rows, else gathered now."""
        kept, self._next = self._next, None
        if kept is not None and kept[0] == k and np.array_equal(kept[1], rows):
            return kept[2]
        return self._gather_rows(rows, k)

    def _gather_rows(self, rows: np.ndarray, k: int) -> Any:
        return self._gather(self._data, np.resize(rows, k * self.loader.batch_size).astype(np.int32))

    def _prefetch(self, stop: int, last: tuple[int, np.ndarray, Any]) -> None:
        """Gathers the next epoch's first block (batches `0..stop-1` of epoch `e + 1`) once this
        epoch's calls are dispatched, before the loop reads the epoch's means: the device then
        gathers while the host ends the epoch, instead of waiting idle for the next epoch's
        gather (devices run their programs in order). `last` (`(k, rows, block)`, this epoch's
        last block) is reused when it holds the same rows (no shuffle). A prefetch the next
        epoch does not ask for (`max_steps`, a resumed position, the end of training) is dropped."""
        stretch = self._stretch(self._order(self.loader._epoch + 1), start=0, stop=stop, steps_left=None)
        first = next(self._blocks(stretch), None)
        if first is None:
            return
        rows = first[1]
        if last[0] == stretch.block and np.array_equal(last[1], rows):
            self._next = last
        else:
            self._next = (stretch.block, rows, self._gather_rows(rows, stretch.block))

    def host_inputs(self, inputs: StepInputs) -> Any:
        """On-device inputs as the host path would have given them (for hooks that read the batch)."""
        batch = self.loader._rows(inputs.rows)
        k, spe = self.options.accumulate_grad_batches, self.options.steps_per_execution
        lead = ((spe,) if spe > 1 else ()) + ((k,) if k > 1 else ())
        stacked = jax.tree.map(lambda x: x.reshape(*lead, -1, *x.shape[1:]), batch)
        mask = np.arange(k * spe).reshape(lead) < inputs.num_batches  # a last group's: its real batches
        return (stacked, mask) if k > 1 else stacked


class _Counts(dict):
    """`{count: the int32 scalar on the devices}`, each put there when first asked for."""

    def __init__(self, sharding) -> None:
        super().__init__()
        self._sharding = sharding

    def __missing__(self, count: int) -> jax.Array:
        self[count] = value = jax.device_put(np.int32(count), self._sharding)
        return value
