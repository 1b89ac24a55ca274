"""What `training_step` / `validation_step` / `test_step` (or `loss`) returned, as the batch-end
hooks' `outputs`, and the lists their evaluation hooks appended to.

The step returns these arrays only when some batch-end hook may read them (the module's, or a
callback's not marked `ignores_outputs`: `CallbackList.reads_outputs`); they stay on the
device, as `jax.Array`s: nothing is copied to the host until a hook reads one (`np.asarray`,
`float`, sklearn), so a hook that never looks costs no transfer. The rows of an evaluation
batch's padding are cut off (a slice, dispatched, not waited for).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from fitjax.step.forward import WHOLE
from fitjax.step.train import OUTPUTS_KEY

__all__ = ["append_rows", "eval_outputs", "merged", "train_returned"]


def merged(values: dict, returned: dict) -> Any:
    """The hooks' `outputs`: the step's values (loss, metrics, logged names) with what the step
    returned in a dict; a returned array alone (Lightning passes it as it is)."""
    if WHOLE in returned:
        return returned[WHOLE]
    return {**values, **returned}


def train_returned(values: dict, chunk: Any, accumulate: int) -> tuple[dict, dict]:
    """A train step's values without what `training_step` returned, and that (`values[OUTPUTS_KEY]`),
    stacked as the hooks' batch is: `[steps]` with `steps_per_execution`, `[micro-batches]` with
    accumulation. An epoch's last step over fewer than `accumulate` micro-batches keeps only
    theirs (the step repeated the last under a zero weight)."""
    values = dict(values)
    returned = values.pop(OUTPUTS_KEY)
    if accumulate > 1 and chunk.num_steps == 1 and chunk.num_batches < accumulate:
        returned = jax.tree.map(lambda x: x[:chunk.num_batches], returned)
    return values, returned


def eval_outputs(values: dict, returned: dict, *, padded_rows: int, size: int) -> Any:
    """`merged` for an evaluation batch of `size` real rows out of `padded_rows` (the global
    batch, every process's padded slice in process order): each leaf with a row per example
    keeps this process's real rows (as Lightning's DDP, each process sees its own)."""
    return merged(values, _real_rows(returned, padded_rows, size))


def append_rows(module: Any, appends: dict[str, list], *, padded_rows: int, size: int) -> None:
    """Appends each value the evaluation hook appended to `module.<attribute>` while traced,
    this batch's real rows of it, as Lightning's `self.validation_step_outputs.append(preds)`."""
    for attr, items in _real_rows(appends, padded_rows, size).items():
        getattr(module, attr).extend(items)


def _real_rows(tree: Any, padded_rows: int, size: int) -> Any:
    if jax.process_count() == 1:
        if size == padded_rows:
            return tree
        return jax.tree.map(lambda x: x[:size] if np.ndim(x) and x.shape[0] == padded_rows else x, tree)
    # the step's outputs are replicated: this process's copy, sliced here alone (an op on the
    # global array would be a program every process must run alike)
    start = jax.process_index() * (padded_rows // jax.process_count())
    return jax.tree.map(lambda x: _local(x)[start:start + size] if np.ndim(x) and x.shape[0] == padded_rows
                        else _local(x), tree)


def _local(x: Any) -> Any:
    return x.addressable_data(0) if isinstance(x, jax.Array) and not x.is_fully_addressable else x
