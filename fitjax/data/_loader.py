"""`DataLoader`: batches of in-memory arrays; per-epoch shuffle, exact resume, process slices."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import jax
import numpy as np

from fitjax.data._batching import _check_int, _leading_dim, _to_numpy


def _host_arrays(data: Any) -> Any:
    """Returns `data` with numpy leaves (host memory is not copied); TypeError for non-arrays."""

    def convert(path: jax.tree_util.KeyPath, leaf: Any) -> np.ndarray:
        array = _to_numpy(leaf)
        if array is None:
            raise TypeError(
                f"`data{jax.tree_util.keystr(path)}` is {leaf!r} (type {type(leaf).__name__}); "
                "DataLoader gathers rows of arrays, so every leaf of `data` must be a numpy "
                "array, jax array or torch tensor. Convert it with np.asarray(...) or drop it "
                "(a Python list is a container here, not an array: use np.asarray(my_list))."
            )
        return array

    return jax.tree_util.tree_map_with_path(convert, data)


class DataLoader:
    """Iterates batches of in-memory arrays: shuffled per epoch, resumable mid-epoch.

    `data` is an array or any pytree of arrays (dict, tuple, list, nested) whose leaves share
    the leading (example) dimension; numpy arrays, jax arrays and torch tensors are accepted and
    held as numpy arrays without copying host memory. Each batch is the same pytree with
    `batch_size` rows per leaf, gathered with one fancy index per leaf.

    The order of epoch `e` is `np.random.default_rng([seed, e]).permutation(n)` when shuffling:
    the same for the same seed and epoch, whatever ran before. `set_epoch(e)` selects the epoch
    (the trainer calls it before each epoch); until then every `iter()` replays epoch 0.

    When `Trainer.fit` trains on a `DataLoader` in one process and a copy of its data on every
    device takes at most 1 GiB in all, the data is kept on the devices: the same batches, in the
    same order, are gathered there in blocks and picked by the step, with no per-step host
    gather or transfer. The copy is taken when `fit` starts, so changes made to the arrays in
    place during training are not seen; a subclass that overrides `__iter__` (to augment, say)
    keeps its own batches, on the host.

    With several processes, `batch_size` is the global batch size and process `p` of `P` yields
    rows `[p * batch_size // P, (p + 1) * batch_size // P)` of each global batch, so the global
    batch is the one a single process would see. When the last global batch is partial (and
    `drop_last` is False), later processes may get fewer rows, or none (arrays of 0 rows); pad
    them with `pad_batch` to `local_batch_size`.

    Args:
      data: an array or a pytree of arrays sharing the leading dimension.
      batch_size: examples per batch, global across processes.
      shuffle: whether to draw a new order every epoch: False, True, or "per_run": with
        `Trainer(runs=...)`, each run draws its own order (run i's is this loader's with
        `seed + i`; True gives every run the same order). Without runs, "per_run" is True.
      seed: the seed of the shuffle; the epoch is mixed in.
      drop_last: whether to drop the last batch when it is smaller than `batch_size`.
      process_index: this process's index; None asks `jax.process_index()` at the first
        iteration (not at construction, so a loader can be built before `jax.distributed`).
      process_count: the number of processes; None asks `jax.process_count()` likewise.

    Example:
      >>> import numpy as np
      >>> data = {"x": np.arange(10.0).reshape(5, 2), "y": np.arange(5)}
      >>> loader = DataLoader(data, batch_size=2, shuffle=True, seed=0)
      >>> len(loader), [b["y"].shape[0] for b in loader]
      (3, [2, 2, 1])
      >>> loader.set_epoch(1)  # a new order for the next pass
    """

    def __init__(
        self,
        data: Any,
        *,
        batch_size: int,
        shuffle: bool | str = False,
        seed: int = 0,
        drop_last: bool = False,
        process_index: int | None = None,
        process_count: int | None = None,
    ) -> None:
        self.batch_size = _check_int(batch_size, where="`DataLoader(batch_size=...)`", minimum=1)
        if not isinstance(shuffle, bool) and shuffle != "per_run":
            raise ValueError(f"`DataLoader(shuffle=...)` must be True, False or 'per_run' (each run of a "
                             f"Trainer(runs=...) fit its own order), got {shuffle!r}.")
        self.shuffle = bool(shuffle)
        self.shuffle_per_run = shuffle == "per_run"
        self.seed = _check_int(seed, where="`DataLoader(seed=...)`", minimum=0)
        self.drop_last = bool(drop_last)
        self._data = _host_arrays(data)
        self._num_examples = _leading_dim(self._data, what="data")
        # Flattened once: a tree_map per batch costs as much as the gather itself for small
        # batches, and a batch is gathered once per training step.
        self._leaves, self._treedef = jax.tree_util.tree_flatten(self._data)
        if self._num_examples == 0:
            raise ValueError(
                "`DataLoader(data=...)` is empty (0 examples): there is nothing to batch. "
                "Check how the data was loaded or filtered."
            )
        if self.drop_last and self.batch_size > self._num_examples:
            raise ValueError(
                f"`DataLoader(batch_size={self.batch_size!r}, drop_last=True)` would yield no "
                f"batch from {self._num_examples} examples; use a batch_size of at most "
                f"{self._num_examples} or drop_last=False."
            )
        if process_count is not None:
            process_count = _check_int(
                process_count, where="`DataLoader(process_count=...)`", minimum=1
            )
            self._check_divisible(process_count)
        if process_index is not None:
            process_index = _check_int(
                process_index, where="`DataLoader(process_index=...)`", minimum=0
            )
            if process_count is not None and process_index >= process_count:
                raise ValueError(
                    f"`DataLoader(process_index=...)` must be below process_count="
                    f"{process_count}; received {process_index!r}."
                )
        self._process_index = process_index
        self._process_count = process_count
        self._epoch = 0
        self._start = 0  # the batch the next iter() starts at: 0, or where a resume left off
        self._batches_seen = 0

    @property
    def num_examples(self) -> int:
        """The number of examples (rows) in the data."""
        return self._num_examples

    @property
    def local_batch_size(self) -> int:
        """Rows per batch on this process: `batch_size // process_count`."""
        return self.batch_size // self._processes()[1]

    def __len__(self) -> int:
        """The number of (global) batches per epoch."""
        full, rest = divmod(self._num_examples, self.batch_size)
        return full + (rest > 0 and not self.drop_last)

    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch whose order the next `iter()` follows.

        Selecting the epoch a loaded `state_dict` was saved in keeps its resume point; any
        other epoch starts from its first batch.
        """
        epoch = _check_int(epoch, where="`DataLoader.set_epoch(epoch)`", minimum=0)
        if epoch != self._epoch:
            self._epoch, self._start, self._batches_seen = epoch, 0, 0

    def state_dict(self) -> dict[str, int]:
        """The position in the data: `{"epoch": ..., "batches_seen": ...}`.

        `batches_seen` counts the batches of the current epoch yielded so far, a batch being
        counted as soon as it is handed out.
        """
        return self._state_at(self._batches_seen)

    def _state_at(self, batches_seen: int) -> dict[str, int]:
        """`state_dict()` once `batches_seen` batches of the selected epoch are handed out."""
        return {"epoch": self._epoch, "batches_seen": batches_seen}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Restores a position from `state_dict()`; the next `iter()` continues from it."""
        if not isinstance(state, Mapping) or set(state) != {"epoch", "batches_seen"}:
            raise ValueError(
                "`DataLoader.load_state_dict(state)` expects the dict from `state_dict()`, "
                f"with keys 'batches_seen' and 'epoch'; received {state!r}."
            )
        epoch = _check_int(state["epoch"], where="`state['epoch']`", minimum=0)
        seen = _check_int(state["batches_seen"], where="`state['batches_seen']`", minimum=0)
        if seen > len(self):
            raise ValueError(
                f"`state['batches_seen']` is {seen!r}, but an epoch of this loader has only "
                f"{len(self)} batches; the state comes from a loader with other data or "
                "batch_size. Rebuild the loader as it was when the state was saved."
            )
        self._epoch, self._start, self._batches_seen = epoch, seen, seen

    def __iter__(self) -> Iterator[Any]:
        # The order and start are fixed here, not at the first next(), so that a state loaded
        # before iter() applies to this pass only.
        start, self._start = self._start, 0
        self._batches_seen = start
        index, count = self._processes()
        return self._batches(self._order(), start, index, count)

    def _order(self, epoch: int | None = None) -> np.ndarray:
        """The row order of the selected epoch (or of `epoch`): a permutation when shuffling."""
        if self.shuffle:
            epoch = self._epoch if epoch is None else epoch
            return np.random.default_rng([self.seed, epoch]).permutation(self._num_examples)
        return np.arange(self._num_examples)

    def _batches(self, order: np.ndarray, start: int, index: int, count: int) -> Iterator[Any]:
        local = self.batch_size // count
        for k in range(start, len(self)):
            rows = order[k * self.batch_size : (k + 1) * self.batch_size]
            batch = self._rows(rows[index * local : (index + 1) * local])
            self._batches_seen = k + 1
            yield batch

    def _rows(self, rows: np.ndarray) -> Any:
        """The batch of `rows` (row numbers into the data): one fancy index per leaf."""
        return self._treedef.unflatten([np.take(leaf, rows, axis=0) for leaf in self._leaves])

    def _processes(self) -> tuple[int, int]:
        index = jax.process_index() if self._process_index is None else self._process_index
        count = jax.process_count() if self._process_count is None else self._process_count
        self._check_divisible(count)
        if index >= count:
            raise ValueError(
                f"`DataLoader(process_index=...)` must be below the process count {count}; "
                f"received {index!r}."
            )
        return index, count

    def _check_divisible(self, count: int) -> None:
        if self.batch_size % count:
            raise ValueError(
                f"`DataLoader(batch_size={self.batch_size!r})` is the global batch size and must "
                f"divide evenly over the {count} processes; use a multiple of {count}, e.g. "
                f"{-(-self.batch_size // count) * count}."
            )

    def __repr__(self) -> str:
        return (
            f"DataLoader(num_examples={self._num_examples}, batch_size={self.batch_size}, "
            f"shuffle={self.shuffle}, seed={self.seed}, drop_last={self.drop_last})"
        )
