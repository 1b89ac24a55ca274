"""`as_loader`: turns what users pass as data into an object the trainer iterates each epoch.

The protocol the trainer relies on, and that every object `as_loader` returns follows:

- `iter(loader)` starts a pass (an epoch) and yields host batches: pytrees of numpy arrays
  whose leaves share the leading (example) dimension. Leaves that are not arrays (strings,
  Python numbers a custom collate left in) pass through unchanged.
- `len(loader)`, optional: the number of batches per pass; raises TypeError when unknown
  (streams, iterable datasets), so `operator.length_hint(loader, -1)` reads it safely.
- `loader.set_epoch(epoch: int)`, optional: called before each pass so shuffling can depend on
  the epoch. Every object `as_loader` returns has it (a no-op where the source has no epochs).
- `loader.state_dict()` / `loader.load_state_dict(state)`, optional: the position within the
  data, for an exact resume. Present only where the source can restore a position
  (`fj.DataLoader`, grain, sources that define both methods); check with `hasattr`. After
  `load_state_dict`, the next `iter()` continues from the saved position; `set_epoch` with the
  saved epoch keeps it, another epoch discards it. States are JSON-friendly (ints, strings,
  dicts, lists).

Accepted: a `fj.DataLoader` (returned as is), a `torch.utils.data.DataLoader`, a grain
`MapDataset`, `IterDataset` or `DataLoader`, any other re-iterable of batches (a list of dicts,
a class with `__iter__`), and a one-shot iterator or generator (one pass only). Libraries are
recognised without being imported: an object of torch or grain cannot exist unless the user
imported it.
"""

from __future__ import annotations

import copy
import reprlib
import sys
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import jax
import numpy as np

from fitjax.data._batching import _to_host
from fitjax.data._datamodule import DataModule
from fitjax.data._loader import DataLoader

_ACCEPTED = (
    "a fj.DataLoader, a torch.utils.data.DataLoader, a grain MapDataset/IterDataset/DataLoader, "
    "or an iterable of batches (pytrees of arrays), e.g. a list of dicts or a generator"
)


class _Batches:
    """A re-iterable of batches whose array leaves become numpy arrays, one batch at a time."""

    def __init__(self, source: Iterable[Any], *, name: str, epoch_target: Any = None) -> None:
        self._source = source
        self._name = name
        self._epoch_target = epoch_target  # an object whose set_epoch gets each epoch, or None
        self._epoch = 0

    def __iter__(self) -> Iterator[Any]:
        return map(_to_host, self._source)

    def __len__(self) -> int:
        try:
            return len(self._source)  # type: ignore[arg-type]
        except TypeError:
            raise TypeError(
                f"`{self._name}` ({type(self._source).__name__}) has no length"
            ) from None

    def set_epoch(self, epoch: int) -> None:
        self._epoch = epoch
        if self._epoch_target is not None:
            self._epoch_target.set_epoch(epoch)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({reprlib.repr(self._source)})"


class _StatefulBatches(_Batches):
    """Forwards `state_dict` / `load_state_dict` to a source that has them."""

    def state_dict(self) -> Any:
        return self._source.state_dict()  # type: ignore[attr-defined]

    def load_state_dict(self, state: Any) -> None:
        self._source.load_state_dict(state)  # type: ignore[attr-defined]


class _GrainBatches(_Batches):
    """A grain dataset or loader; its iterators' `get_state` / `set_state` give the position."""

    def __init__(self, source: Iterable[Any], *, name: str) -> None:
        super().__init__(source, name=name)
        self._iterator: Any = None
        self._pending: Any = None  # a loaded iterator state, applied by the next iter()

    def __iter__(self) -> Iterator[Any]:
        self._iterator = iter(self._source)
        if self._pending is not None:
            pending, self._pending = self._pending, None
            # grain.DataLoader states are JSON bytes; they are kept as str to stay JSON-friendly.
            self._iterator.set_state(pending.encode() if isinstance(pending, str) else pending)
        return map(_to_host, self._iterator)

    def set_epoch(self, epoch: int) -> None:
        if epoch != self._epoch:  # another epoch starts from its beginning
            self._pending, self._iterator = None, None
        super().set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        if self._iterator is None:
            state = self._pending
        else:
            state = self._iterator.get_state()
        if isinstance(state, bytes):
            state = state.decode()
        return {"epoch": self._epoch, "iterator": state}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if not isinstance(state, Mapping) or set(state) != {"epoch", "iterator"}:
            raise ValueError(
                f"`{self._name}.load_state_dict(state)` expects the dict from `state_dict()`, "
                f"with keys 'epoch' and 'iterator'; received {state!r}."
            )
        self._epoch, self._pending, self._iterator = state["epoch"], state["iterator"], None


class _OneShotBatches(_Batches):
    """An iterator or generator: one pass, then a clear error instead of a silent empty epoch."""

    def __init__(self, source: Iterator[Any], *, name: str) -> None:
        super().__init__(source, name=name)
        self._exhausted = False

    def __iter__(self) -> Iterator[Any]:
        if self._exhausted:
            raise RuntimeError(
                f"`{self._name}` is a one-shot iterator ({type(self._source).__name__}) that is "
                "already exhausted, so it cannot give another epoch. Pass a re-iterable instead "
                "(a fj.DataLoader, a list of batches, or an object whose __iter__ starts over), "
                "or set max_steps so that training ends within one pass."
            )
        return self._drain()

    def _drain(self) -> Iterator[Any]:
        for batch in self._source:
            yield _to_host(batch)
        self._exhausted = True


def _array_kind(data: Any) -> str | None:
    if isinstance(data, np.ndarray):
        return "numpy array"
    if isinstance(data, jax.Array):
        return "jax array"
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(data, torch.Tensor):
        return "torch tensor"
    return None


def _describe_arrays(data: Any) -> str | None:
    """Describes `data` if it is raw arrays: an array, a dict of arrays or a tuple like (x, y)."""
    kind = _array_kind(data)
    if kind is not None:
        return f"a {kind} of shape {tuple(data.shape)}"
    if isinstance(data, Mapping):
        leaves = jax.tree_util.tree_leaves_with_path(data)
    elif isinstance(data, tuple):
        leaves = [((jax.tree_util.SequenceKey(i),), item) for i, item in enumerate(data)]
    else:
        return None
    if leaves and all(_array_kind(leaf) is not None for _, leaf in leaves):
        listing = ", ".join(
            f"{jax.tree_util.keystr(path)}: {tuple(leaf.shape)}" for path, leaf in leaves
        )
        return f"a {type(data).__name__} of arrays ({listing})"
    return None


def unshuffled(data: Any) -> tuple[Any, bool]:
    """`data` drawing its batches in order: `(loader, True)` for a shuffling `fj.DataLoader` (a
    copy with `shuffle=False`) or torch `DataLoader` (rebuilt on a `SequentialSampler`, as
    Lightning's `overfit_batches` does); `(data, False)` for anything else, left as it is."""
    if isinstance(data, DataLoader):
        if not data.shuffle:
            return data, False
        data = copy.copy(data)
        data.shuffle = False
        return data, True
    torch_data = sys.modules.get("torch.utils.data")
    if torch_data is not None and isinstance(data, torch_data.DataLoader) and isinstance(
            data.sampler, torch_data.RandomSampler) and data.batch_size is not None:
        return torch_data.DataLoader(
            data.dataset, batch_size=data.batch_size, shuffle=False, num_workers=data.num_workers,
            collate_fn=data.collate_fn, pin_memory=data.pin_memory, drop_last=data.drop_last,
            worker_init_fn=data.worker_init_fn), True
    return data, False


def as_loader(data: Any, *, name: str = "train_data") -> Iterable[Any]:
    """Turns what a user passes as data into an object the trainer iterates each epoch.

    See the module docstring for the protocol the result follows. Raw arrays are refused rather
    than batched with guessed settings: the batch size and shuffling are the user's choice.

    Args:
      data: a `fj.DataLoader` (returned as is), a `torch.utils.data.DataLoader`, a grain
        `MapDataset` / `IterDataset` / `DataLoader`, another re-iterable of batches, or a one-shot
        iterator (a second pass over it raises).
      name: the argument's name in the caller, used in error messages ("val_data", ...).

    Returns:
      An iterable of host batches (pytrees of numpy arrays) with `set_epoch`, and `len` and
      `state_dict` / `load_state_dict` where the source provides them.

    Raises:
      TypeError: for raw arrays or dicts/tuples of arrays (the message shows how to wrap them
        in a `fj.DataLoader`), unbatched torch datasets, a `DataModule`, None and other values
        that are not iterables of batches.

    Example:
      >>> import numpy as np
      >>> loader = as_loader([{"x": np.zeros((4, 2))}, {"x": np.ones((4, 2))}])
      >>> len(loader), [batch["x"].shape for batch in loader]
      (2, [(4, 2), (4, 2)])
    """
    if isinstance(data, DataLoader):
        return data
    torch_data = sys.modules.get("torch.utils.data")
    if torch_data is not None:
        if isinstance(data, torch_data.DataLoader):
            return _torch_loader(data, name=name)
        if isinstance(data, (torch_data.Dataset, torch_data.IterableDataset)):
            raise TypeError(
                f"`{name}` received a torch dataset ({type(data).__name__}), which yields single "
                f"examples; batch it: `torch.utils.data.DataLoader({name}, batch_size=32, "
                "shuffle=True)` (batch_size=None if it already yields batches)."
            )
    grain = sys.modules.get("grain")
    if grain is not None:
        grain_types = tuple(
            getattr(grain, kind)
            for kind in ("MapDataset", "IterDataset", "DataLoader")
            if hasattr(grain, kind)
        )
        if isinstance(data, grain_types):
            return _GrainBatches(data, name=name)
    described = _describe_arrays(data)
    if described is not None:
        raise TypeError(
            f"`{name}` received {described}; wrap it: "
            "`fj.DataLoader(data, batch_size=32, shuffle=True)`"
        )
    if isinstance(data, DataModule):
        raise TypeError(
            f"`{name}` received a DataModule, which is not itself a loader; pass one of its "
            f"loaders, e.g. `{name}=dm.train_dataloader()`, or give the trainer the DataModule "
            "itself (`datamodule=dm`)."
        )
    if isinstance(data, (str, bytes, Mapping)) or not isinstance(data, Iterable):
        raise TypeError(f"`{name}` must be {_ACCEPTED}; received {reprlib.repr(data)}.")
    if isinstance(data, Iterator):
        return _OneShotBatches(data, name=name)
    if hasattr(data, "state_dict") and hasattr(data, "load_state_dict"):
        return _StatefulBatches(data, name=name, epoch_target=_epoch_target(data))
    return _Batches(data, name=name, epoch_target=_epoch_target(data))


def _epoch_target(source: Any) -> Any:
    return source if callable(getattr(source, "set_epoch", None)) else None


def _torch_loader(loader: Any, *, name: str) -> _Batches:
    """Wraps a torch DataLoader; `set_epoch` reaches a sampler that has one (DistributedSampler)."""
    samplers = (loader.sampler, getattr(loader.batch_sampler, "sampler", None))
    target = next((s for s in samplers if callable(getattr(s, "set_epoch", None))), None)
    if hasattr(loader, "state_dict") and hasattr(loader, "load_state_dict"):
        return _StatefulBatches(loader, name=name, epoch_target=target)  # torchdata's loaders
    return _Batches(loader, name=name, epoch_target=target)


def as_loaders(data: Any, *, name: str) -> list[Iterable[Any]]:
    """Several evaluation loaders as Lightning takes them, or one: each through `as_loader`.

    A list, tuple or dict is several loaders when each of its items is a loader (a
    `fj.DataLoader`, a torch or grain loader, a list of batches, any other iterable that is not
    itself a batch); a dict's loaders are taken in its order (Lightning's `dataloader_idx`).
    Anything else is one loader, so a list of batches stays one loader.

    Example:
      >>> import numpy as np
      >>> a = [{"x": np.zeros((4, 2))}]
      >>> len(as_loaders([a, a], name="val_data")), len(as_loaders(a, name="val_data"))
      (2, 1)
    """
    return [as_loader(item, name=item_name) for item_name, item in each_loader(data, name=name)]


def each_loader(data: Any, *, name: str) -> list[tuple[str, Any]]:
    """`(name, data)` of each loader `as_loaders` makes, before `as_loader` wraps it."""
    if isinstance(data, Mapping) and data and all(_is_loader(item) for item in data.values()):
        return [(f"{name}[{key!r}]", item) for key, item in data.items()]
    if isinstance(data, (list, tuple)) and data and all(_is_loader(item) for item in data):
        return [(f"{name}[{i}]", item) for i, item in enumerate(data)]
    return [(name, data)]


def _is_loader(item: Any) -> bool:
    """Whether an item of a list/tuple/dict is a loader rather than a batch: a batch is an
    array, a dict or tuple, or a list of arrays (torch's `[x, y]`); a list of batches (dicts,
    tuples, lists) is a loader, as is any other iterable object."""
    if isinstance(item, (Mapping, tuple, str, bytes)) or _array_kind(item) is not None:
        return False
    if isinstance(item, list):
        return bool(item) and all(isinstance(batch, (Mapping, list, tuple)) for batch in item)
    return isinstance(item, Iterable)
