"""Checks of the data a run is given: at fit start what the loader's sizes already tell, then each
host batch as it is drawn, with errors that name the batch, the leaf and the numbers.

The loop calls `check_fit_data` once per fit and wraps its batch iterators in `checked_batches`.
The per-batch check reads only shapes and dtypes of the host arrays (no device work, no copy):
about a microsecond per leaf, against the hundreds a step's dispatch takes (see
`benchmarks/data_checks.py`). Batches picked on the devices (`fitjax.data._device_blocks`) are never
drawn on the host and cost nothing; their data was checked when it was put there.
"""

from __future__ import annotations

import sys
import warnings
import weakref
from collections.abc import Iterable, Iterator
from typing import Any, Sequence

import jax
import numpy as np

from fitjax.data._batching import _leading_dim
from fitjax.data._loader import DataLoader

__all__ = ["check_batch", "check_fit_data", "checked_batches"]

# dtype kinds JAX puts on a device: bool, ints, floats, complex; ml_dtypes' types (bfloat16,
# float8, int4) are numpy user types (kind "V", isbuiltin 2). Strings, objects, dates are not.
_DEVICE_KINDS = frozenset("biufc")


def _on_device(dtype: np.dtype) -> bool:
    return dtype.kind in _DEVICE_KINDS or (dtype.kind == "V" and dtype.isbuiltin == 2)


def _name(loader: Any, stage: str) -> str:
    """The argument the user passed the data as, for messages."""
    name = getattr(loader, "_name", None)  # set by `as_loader`; a fj.DataLoader is passed as is
    if name is not None and name != "data":
        return name
    return {"train": "train_data", "val": "val_data"}.get(stage, f"the {stage} data")


def _length(loader: Any) -> int | None:
    try:
        return len(loader)
    except TypeError:
        return None


# ---------------------------------------------------------------------------- at fit start

def check_fit_data(train: Any, val: Sequence[Any] = (), *, shards: int, processes: int = 1,
                   limit: int | float | None = None, max_steps: int | None = None,
                   accumulate: int = 1, resuming: bool = False) -> None:
    """What the loaders' sizes tell before the first step: raises or warns naming the numbers.

    Raises when the batch size, or the size of a last partial batch that training will reach,
    does not divide over the devices a batch is split over (it would fail with a sharding error
    at the end of the first epoch). Warns when `train` has no length and nothing bounds an epoch
    (it may never end), and when `val` has no batch.

    Args:
      train: the train loader (what `as_loader` returned).
      val: the validation loaders (none, one or several).
      shards: how many pieces a global batch is split into (`strategy.num_batch_shards`).
      processes: the number of processes feeding the devices.
      limit: `Trainer(limit_train_batches=...)`.
      max_steps: `Trainer(max_steps=...)`; with `accumulate` it tells whether the last batch of
        an epoch is ever reached.
      accumulate: batches per optimizer step.
      resuming: the fit resumes a checkpoint (the batch size error says it must stay as saved).
    """
    length = _length(train)
    if length is None:
        if max_steps is None and not isinstance(limit, int):
            kind = type(getattr(train, "_source", train)).__name__  # what the user passed
            warnings.warn(
                f"`{_name(train, 'train')}` ({kind}) has no length and neither "
                "`Trainer(max_steps=...)` nor an int `limit_train_batches` is set: an epoch lasts "
                "as long as the data, so if it never ends, training never stops (and validation "
                "at epoch ends never runs). Set `max_steps` (or `limit_train_batches`) to bound it.",
                UserWarning, stacklevel=3)
    else:
        _check_sizes(train, length, shards=shards, processes=processes, limit=limit,
                     max_batches=None if max_steps is None else max_steps * accumulate, resuming=resuming)
    for loader in val:
        if _length(loader) == 0:
            warnings.warn(
                f"`{_name(loader, 'val')}` has no batches (its length is 0): each validation will see "
                "no example and log nothing from it. Pass data with at least one batch, or no val_data.",
                UserWarning, stacklevel=3)


def _batch_sizes(loader: Any) -> tuple[int, int, bool, bool] | None:
    """`(examples, batch_size, drop_last, global)` where the loader tells them, else None.

    `global` is True for a `fj.DataLoader` (its batch size is split over processes) and False
    for a torch `DataLoader` (each process has its own sampler and batch size)."""
    if isinstance(loader, DataLoader):
        return loader.num_examples, loader.batch_size, loader.drop_last, True
    source = getattr(loader, "_source", None)  # a torch DataLoader as `as_loader` wraps it
    torch_data = sys.modules.get("torch.utils.data")
    if (torch_data is None or not isinstance(source, torch_data.DataLoader)
            or source.batch_size is None or isinstance(source.dataset, torch_data.IterableDataset)):
        return None
    try:
        examples = len(source.sampler)  # this process's share under a DistributedSampler
    except TypeError:
        return None
    return examples, source.batch_size, source.drop_last, False


def _check_sizes(loader: Any, length: int, *, shards: int, processes: int,
                 limit: int | float | None, max_batches: int | None, resuming: bool = False) -> None:
    sizes = _batch_sizes(loader)
    if sizes is None:
        return
    examples, batch_size, drop_last, is_global = sizes
    name = _name(loader, "train")
    per_process = batch_size // processes if is_global else batch_size
    local_shards = max(shards // processes, 1)
    where = _devices(shards, processes)
    if per_process % local_shards:
        multiple = local_shards * (processes if is_global else 1)
        fix = (f"A resumed run keeps the global batch size it was saved with (its data position counts those "
               f"batches, so it sees the same examples in the same order): resume on a device count that "
               f"divides {batch_size} (`Trainer(devices=...)`)." if resuming else
               f"Use a batch size that is a multiple of {multiple}, or fewer devices (`Trainer(devices=...)`).")
        raise ValueError(
            f"`{name}` has a batch size of {batch_size}{_per(per_process, processes, is_global)}, "
            f"which does not divide over {where}. {fix}"
        )
    last = 0 if drop_last else examples % batch_size
    if not last:
        return
    reached = length if limit is None else (
        min(limit, length) if isinstance(limit, int) else int(length * limit) if limit < 1 else length)
    if reached < length or (max_batches is not None and max_batches < length):
        return  # the short batch is cut by limit_train_batches / max_steps before it is drawn
    if is_global:  # process p takes rows [p * per_process, (p + 1) * per_process) of it
        pieces = [min(max(last - p * per_process, 0), per_process) for p in range(processes)]
    else:
        pieces = [last]
    if all(piece == pieces[0] and piece % local_shards == 0 for piece in pieces):
        return
    split = f" (per process: {pieces})" if len(pieces) > 1 else ""
    if len(pieces) > 1:  # the first processes fill their share first: only a full batch splits evenly
        fix = f"a multiple of the batch size ({examples - last} or {examples - last + batch_size} examples)"
    else:
        fits = last - last % local_shards
        fix = (f"a number of examples that leaves a multiple of {local_shards} in the last batch "
               f"(e.g. {examples - last + fits if fits else examples - last} examples)")
    raise ValueError(
        f"The last batch of each epoch of `{name}` has {last} examples ({examples} examples = "
        f"{examples // batch_size} batches of {batch_size} + {last}){split}, which do not divide "
        f"over {where}: the step would fail at the end of the first epoch. Drop it "
        f"(`drop_last=True` in the DataLoader), or use {fix}."
    )


def _devices(shards: int, processes: int) -> str:
    if processes > 1:
        return f"the {max(shards // processes, 1)} devices of each of the {processes} processes"
    return f"the {shards} devices of the strategy's data axis"


def _per(per_process: int, processes: int, is_global: bool) -> str:
    return f" ({per_process} per process)" if is_global and processes > 1 else ""


# --------------------------------------------------------------------------- each batch

def check_batch(batch: Any, *, name: str = "batch", where: str = "", shards: int | None = None) -> int:
    """Checks one host batch and returns its number of rows (examples).

    Every leaf must be an array with a leading (example) dimension shared by all leaves and a
    dtype JAX can put on a device; with `shards`, the rows must divide into that many pieces.
    Reads shapes and dtypes only (no copy, no device work).

    Args:
      batch: a pytree of host arrays.
      name: the data's name in messages ("train_data").
      where: the batch's position in messages ("batch 3 of epoch 1").
      shards: the number of devices the batch is split over, or None (padded evaluation).

    Raises:
      ValueError: a leaf without a leading dimension, leaves that disagree on it (each leaf
        path and size named), or rows that do not divide over `shards`.
      TypeError: a leaf of strings, objects or dates (the leaf path and dtype named).

    Example:
      >>> import numpy as np
      >>> check_batch({"x": np.zeros((8, 3)), "y": np.zeros(8)}, shards=4)
      8
    """
    rows = None
    for leaf in jax.tree_util.tree_leaves(batch):
        shape = getattr(leaf, "shape", None)
        if not shape or (rows is not None and shape[0] != rows):
            rows = _describe_rows(batch, name, where)  # raises, naming every leaf
        if rows is None:
            rows = shape[0]
        dtype = getattr(leaf, "dtype", None)
        if dtype is not None and not _on_device(dtype):
            raise _dtype_error(batch, name, where)
    if rows is None:
        rows = _describe_rows(batch, name, where)  # no leaves: raises
    if shards is not None and rows % shards:
        raise ValueError(
            f"{_at(name, where)} has {rows} examples, which do not divide over the {shards} "
            f"devices the batch is split over. Make every batch a multiple of {shards} examples: "
            "for a short last batch, drop it (`drop_last=True` in a DataLoader); or use fewer "
            "devices (`Trainer(devices=...)`)."
        )
    return rows


def _at(name: str, where: str) -> str:
    return f"{where[0].upper()}{where[1:]} of `{name}`" if where else f"`{name}`"


def _describe_rows(batch: Any, name: str, where: str) -> int:
    try:
        return _leading_dim(batch, what=name)
    except ValueError as err:
        raise ValueError(f"{_at(name, where)}: {err}") from None


def _dtype_error(batch: Any, name: str, where: str) -> TypeError:
    for path, leaf in jax.tree_util.tree_leaves_with_path(batch):
        dtype = getattr(leaf, "dtype", None)
        if dtype is not None and not _on_device(dtype):
            break
    kind = {"O": "Python objects", "U": "strings", "S": "bytes", "M": "dates", "m": "time deltas"}
    return TypeError(
        f"{_at(name, where)}: the leaf `{name}{jax.tree_util.keystr(path)}` has dtype {dtype} "
        f"({kind.get(dtype.kind, 'not a number type')}), which JAX cannot put on a device. Keep "
        "it out of the batch the step gets (e.g. drop ids and file names in the collate "
        "function), or turn it into numbers first (an index into a vocabulary, np.float32)."
    )


_EMPTY_SEEN: weakref.WeakSet = weakref.WeakSet()  # loaders already warned about, to warn once


def _first_time_empty(loader: Any) -> bool:
    try:
        if loader in _EMPTY_SEEN:
            return False
        _EMPTY_SEEN.add(loader)
    except TypeError:  # not weak-referenceable: warn every time
        pass
    return True


def checked_batches(loader: Any, batches: Iterable[Any] | None = None, *, stage: str = "train",
                    epoch: int | None = None, shards: int | None = None, start: int = 0,
                    limit: int | None = None) -> Iterator[Any]:
    """`batches` (default: one pass over `loader`) with `check_batch` applied to each as drawn.

    When the pass yields no batch at all, warns naming the data and the epoch (once per
    loader): an empty validation or epoch would otherwise pass without a word.

    Args:
      loader: the loader the batches come from (named in messages).
      batches: the batches to check, e.g. one epoch's; None iterates `loader`.
      stage: "train", "val", "test" or "predict", for names in messages.
      epoch: the epoch, for messages.
      shards: devices each batch is split over (train); None for padded evaluation.
      start: the number of the first batch (an epoch resumed mid-way starts later).
      limit: the batches `batches` was cut to (`limit_train_batches`); 0 asks for none, so an
        empty pass is not warned about.
    """
    name = _name(loader, stage)
    index = start
    of_epoch = "" if epoch is None else f" of epoch {epoch}"
    for batch in loader if batches is None else batches:
        check_batch(batch, name=name, where=f"batch {index}{of_epoch}", shards=shards)
        index += 1
        yield batch
    # An empty first epoch is an error the loop raises itself (there is nothing to build on).
    if index == 0 and limit != 0 and not (stage == "train" and epoch == 0) and _first_time_empty(loader):
        what = "trained nothing" if stage == "train" else "has no results"
        warnings.warn(
            f"`{name}` yielded no batch{' in epoch ' + str(epoch) if epoch is not None else ''}: "
            f"the {'epoch' if stage == 'train' else stage + ' run'} {what}. An iterator that is "
            "used up, or a dataset filtered to nothing, passes this way; give data that yields "
            "batches every pass.",
            UserWarning, stacklevel=2)
