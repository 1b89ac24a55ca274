"""Host batches grouped into what one call of the train step consumes (`StepInputs`).

With accumulation, `accumulate_grad_batches` batches are stacked into one optimizer step's
micro-batches (`(stacked [k, ...], mask [k])`); with several steps per call, `steps_per_execution`
of those are stacked again. An epoch's leftovers (fewer than a full call) run one optimizer step
per call. Pure host work (numpy), no device and no loop state.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Iterator

import jax
import numpy as np

from fitjax._typing import Batch
from fitjax.step.options import StepOptions

__all__ = ["StepInputs", "group_batches"]


@dataclasses.dataclass
class StepInputs:
    """What one call of the train step consumes.

    `inputs` is the batch itself (plain), `(batches [k, ...], mask [k])` with accumulation, with
    an extra leading `[steps]` dimension when several steps run per call (`full`). Inputs that are
    not `full` are run by the one-step function (leftovers of an epoch or of `max_steps`).
    `on_device` inputs are `(block, base, count)`, a block of batches already on the devices, from
    which the step picks its own (`fitjax.step.train.picking`), `count` of them real; `rows` are
    then their row numbers (an epoch's last accumulation group's padded like `group_batches`').
    """

    inputs: Any
    num_batches: int
    num_steps: int
    full: bool
    rows: Any = None
    on_device: bool = False


def _shape_of(batch: Batch):
    return tuple((x.shape, str(x.dtype)) for x in jax.tree.leaves(batch))


def _stack(items: list) -> Any:
    return jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *items)


def _groups(batches: Iterable[Batch], k: int) -> Iterator[tuple[Any, int]]:
    """Accumulation groups `((stacked, mask), n_real)`; the last of an epoch may hold fewer than
    k real micro-batches (padded by repeating its last one under a zero mask). A batch of another
    shape (a short last batch) closes the group and starts its own."""
    if k == 1:
        for batch in batches:
            yield batch, 1
        return
    group: list = []

    def emit():
        n = len(group)
        return (_stack(group + [group[-1]] * (k - n)), np.arange(k) < n), n

    for batch in batches:
        if group and _shape_of(batch) != _shape_of(group[0]):
            yield emit()
            group = []
        group.append(batch)
        if len(group) == k:
            yield emit()
            group = []
    if group:
        yield emit()


def group_batches(batches: Iterable[Batch], options: StepOptions, *, steps_left: int | None
                  ) -> Iterator[StepInputs]:
    """`batches` grouped into step calls, stopping after `steps_left` optimizer steps (None: all)."""
    spe = options.steps_per_execution
    buffer: list[tuple[Any, int]] = []

    def leftovers():
        for inputs, n in buffer:
            yield StepInputs(inputs, n, 1, full=False)

    for item in _groups(batches, options.accumulate_grad_batches):
        if steps_left is not None and steps_left <= 0:
            return
        if spe == 1:
            yield StepInputs(item[0], item[1], 1, full=True)
            steps_left = None if steps_left is None else steps_left - 1
            continue
        if buffer and _shape_of(item[0]) != _shape_of(buffer[0][0]):
            yield from leftovers()
            steps_left = None if steps_left is None else steps_left - len(buffer)
            buffer = []
        buffer.append(item)
        if steps_left is not None and steps_left < spe:
            yield from leftovers()
            steps_left -= len(buffer)
            buffer = []
        elif len(buffer) == spe:
            yield StepInputs(_stack([it[0] for it in buffer]), sum(it[1] for it in buffer), spe, full=True)
            steps_left = None if steps_left is None else steps_left - spe
            buffer = []
    yield from leftovers()  # the epoch's leftovers: one step each
