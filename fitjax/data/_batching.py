"""Host-side batch helpers: converting leaves to numpy, measuring and padding batches.

A batch is a pytree (dict, tuple, list, nested) whose leaves are arrays sharing the leading
(example) dimension.
"""

from __future__ import annotations

import numbers
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def _to_numpy(leaf: Any) -> np.ndarray | None:
    """Returns `leaf` as a numpy array without copying host memory, or None if it is no array.

    jax arrays are fetched to the host (a copy only when they live on an accelerator); torch
    tensors share their memory through `Tensor.numpy()`. torch is only looked up, never imported:
    a torch tensor cannot exist unless the user imported torch.
    """
    if isinstance(leaf, np.ndarray):
        return leaf
    if isinstance(leaf, jax.Array):
        return np.asarray(leaf)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(leaf, torch.Tensor):
        tensor = leaf.detach()
        if tensor.device.type != "cpu":
            tensor = tensor.cpu()
        if tensor.dtype == torch.bfloat16:  # numpy has no bfloat16; reinterpret the bits, no copy
            return tensor.view(torch.int16).numpy().view(jnp.bfloat16)
        return tensor.numpy()
    if hasattr(leaf, "__array__") and not isinstance(leaf, (str, bytes)):
        return np.asarray(leaf)
    return None


def _to_host(batch: Any) -> Any:
    """Converts the array leaves of `batch` (numpy, jax, torch) to numpy; others pass as is."""

    def convert(leaf: Any) -> Any:
        array = _to_numpy(leaf)
        return leaf if array is None else array

    return jax.tree_util.tree_map(convert, batch)


def _check_int(value: Any, *, where: str, minimum: int) -> int:
    """Returns `value` as an int, or raises naming `where` (e.g. "`DataLoader(batch_size=...)`")."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise TypeError(f"{where} must be an int >= {minimum}; received {value!r}.")
    if value < minimum:
        raise ValueError(f"{where} must be an int >= {minimum}; received {value!r}.")
    return int(value)


def _where(what: str, path: jax.tree_util.KeyPath) -> str:
    return f"`{what}{jax.tree_util.keystr(path)}`"


def _leading_dim(tree: Any, *, what: str) -> int:
    """The leading dimension shared by every leaf of `tree`; `what` names the tree in errors."""
    leaves = jax.tree_util.tree_leaves_with_path(tree)
    if not leaves:
        raise ValueError(
            f"`{what}` has no array leaves (received {tree!r}); a batch is a pytree of arrays "
            "with one row per example, e.g. {'x': x, 'y': y}."
        )
    sizes = {}
    for path, leaf in leaves:
        shape = getattr(leaf, "shape", None)
        shape = np.shape(leaf) if shape is None else tuple(shape)
        if not shape:
            raise ValueError(
                f"{_where(what, path)} is a scalar ({leaf!r}) with no leading (example) "
                "dimension; every leaf needs one row per example. Give it a leading axis, "
                "e.g. np.full(n, value), or move it out of the data."
            )
        sizes[_where(what, path)] = shape[0]
    if len(set(sizes.values())) > 1:
        listing = ", ".join(f"{where}: {size}" for where, size in sizes.items())
        raise ValueError(
            f"The leaves of `{what}` disagree on the leading (example) dimension: {listing}. "
            "Every leaf must hold one row per example; fix the leaves whose size differs."
        )
    return next(iter(sizes.values()))


def batch_size_of(batch: Any) -> int:
    """Returns the number of examples in a batch: the leading dimension of its leaves.

    Args:
      batch: a pytree of arrays (numpy, jax or torch) that share the leading dimension.

    Returns:
      The leading dimension shared by every leaf.

    Raises:
      ValueError: if the batch has no array leaves, a leaf is a scalar, or leaves disagree on
        the leading dimension (the message names each leaf path and its size).

    Example:
      >>> import numpy as np
      >>> batch_size_of({"x": np.zeros((32, 8)), "y": np.zeros(32)})
      32
    """
    return _leading_dim(batch, what="batch")


def pad_batch(batch: Any, size: int) -> tuple[Any, np.ndarray]:
    """Pads a batch along the example axis to `size` rows and returns it with a row mask.

    Padding repeats the last real row rather than writing zeros: padded rows are then valid
    inputs, so a loss that is finite on real data stays finite on them (a zero row can make a
    loss NaN, e.g. through a zero norm, and `0 * NaN` is still NaN under the mask). An empty
    batch has no row to repeat and is padded with zeros.

    Args:
      batch: a pytree of arrays sharing the leading dimension, at most `size` rows.
      size: the number of rows wanted, e.g. the batch size the step was compiled for.

    Returns:
      `(padded, mask)`: `padded` has the structure of `batch` with numpy leaves of `size` rows;
      `mask` is a float32 vector of `size` entries, 1 for real rows and 0 for padding. A batch
      that already has `size` rows is returned unchanged (the same object) with an all-ones mask.

    Raises:
      ValueError: if `size` is smaller than the batch.

    Example:
      >>> import numpy as np
      >>> padded, mask = pad_batch({"x": np.arange(3.0)}, 4)
      >>> padded["x"], mask
      (array([0., 1., 2., 2.]), array([1., 1., 1., 0.], dtype=float32))
    """
    size = _check_int(size, where="`pad_batch(..., size=...)`", minimum=0)
    rows = batch_size_of(batch)
    if size < rows:
        raise ValueError(
            f"`pad_batch(..., size=...)` must be at least the batch's {rows} rows; received "
            f"size={size!r}. Padding cannot shrink a batch: pass the compiled batch size."
        )
    mask = np.zeros(size, np.float32)
    mask[:rows] = 1.0
    if size == rows:
        return batch, mask

    def pad(leaf: Any) -> np.ndarray:
        array = _to_numpy(leaf)
        array = np.asarray(leaf) if array is None else array
        if rows == 0:
            filler = np.zeros((size, *array.shape[1:]), array.dtype)
        else:
            filler = np.repeat(array[-1:], size - rows, axis=0)
        return np.concatenate([array, filler])

    return jax.tree_util.tree_map(pad, batch), mask
