"""The train data as the fit loop consumes it: `fit_loaders` (the loaders from `fit`'s
arguments), and `TrainFeed`, built once per fit: an epoch's batches (from a resume position),
grouped into chunks for one call of the train step each, picked on the devices when the data is
kept there, else prefetched onto them; the loader's position after each batch; each
accumulation count's steps and device copy.

The loop position is counted in batches *consumed by steps*, not drawn from the loader: the
trainer shards a batch ahead of the step that uses it, so the loader itself is one batch ahead.
`BatchPositions` keeps the loader's `state_dict()` taken right after each batch is drawn, keyed by
that batch's number in the epoch, and a save picks the state belonging to the last stepped batch.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import warnings
from typing import Any, Callable, Iterable, Iterator

import jax

from fitjax import step as step_lib
from fitjax._typing import Batch
from fitjax.data import (Feed, as_loader, batch_size_of, check_fit_data, checked_batches, each_loader, feed_for,
                         unshuffled)
from fitjax.loop import _arguments, _token_ids
from fitjax.loop import _checks as checks
from fitjax.loop._checks import maybe_len as _maybe_len
from fitjax.loop._host_hooks import with_transfer_hooks
from fitjax.module import check_dataloader_idx

__all__ = ["BatchPositions", "FitLoaders", "TrainFeed", "check_fit_loaders", "epoch_options", "fit_loaders"]

_PREFETCH = 2  # batches sharded onto devices ahead of the step that consumes them
_KEEP = 8  # loader states kept behind the newest drawn batch (the prefetch depth is 2)


@dataclasses.dataclass(frozen=True)
class FitLoaders:
    """fit's loaders, and the hooks `reload_dataloaders_every_n_epochs` asks again (None: a
    loader passed to `fit` directly, which is kept)."""

    train: Any
    val: list
    train_hook: Callable[[], Any] | None = None
    val_hook: Callable[[], Any] | None = None
    module: Any = None  # whose batch transfer hooks each batch passes through

    @property
    def reloadable(self) -> bool:
        return self.train_hook is not None or self.val_hook is not None

    def reloaded(self, overfit: bool) -> "FitLoaders":
        """The loaders asked for again from the hooks they came from (Lightning's
        `reload_dataloaders_every_n_epochs`)."""
        train_data = self.train_hook() if self.train_hook else self.train
        train, val = _as_fit_loaders(train_data, self.val_hook() if self.val_hook else None, overfit, self.module)
        return dataclasses.replace(self, train=train, val=val if self.val_hook else self.val)


def _in_order(data, prefix: str):
    data, changed = unshuffled(data)
    if changed:  # Lightning's warning, word for word
        warnings.warn(f"You requested to overfit but enabled {prefix} dataloader shuffling. We are turning "
                      f"off the {prefix} dataloader shuffling for you.", UserWarning, stacklevel=5)
    return data


def fit_loaders(module, train_data, val_data, datamodule, *, overfit: bool) -> FitLoaders:
    """fit's train and validation loaders: the data passed, else the datamodule's, else the
    module's own `train_dataloader()` / `val_dataloader()` (Lightning's order); the module's
    `prepare_data()` and `setup("fit")` run before its loaders are asked for."""
    from_hooks = (train_data is None, val_data is None)
    if datamodule is not None:
        if train_data is not None or val_data is not None:
            raise ValueError("Trainer.fit: pass either train_data/val_data or datamodule=, not both.")
        checks.check_datamodule("fit", datamodule)
        datamodule.prepare_data()
        datamodule.setup("fit")
        train_data = datamodule.train_dataloader()
        try:
            val_data = datamodule.val_dataloader()
        except NotImplementedError:
            val_data = None
    _arguments.prepare_module(module, "fit")
    if datamodule is None:
        if train_data is None:
            train_data = _arguments.module_loader(module, "train_dataloader")
        if val_data is None:
            val_data = _arguments.module_loader(module, "val_dataloader")
    if train_data is None:
        raise ValueError(
            "Trainer.fit needs train_data (e.g. `fj.DataLoader(arrays, batch_size=64, shuffle=True)`), "
            f"datamodule=, or a `train_dataloader()` method on {type(module).__name__}."
        )
    source = datamodule if datamodule is not None else module
    train, val = _as_fit_loaders(train_data, val_data, overfit, module)
    return FitLoaders(train, val, module=module,
                      train_hook=getattr(source, "train_dataloader", None) if from_hooks[0] else None,
                      val_hook=(getattr(source, "val_dataloader", None)
                                if from_hooks[1] and val_data is not None else None))


def epoch_options(options: step_lib.StepOptions, accumulation, epoch: int, *, hook_outputs: bool
                  ) -> step_lib.StepOptions:
    """The step options of train epoch `epoch`: the count of an accumulation schedule
    (`GradientAccumulationScheduler`, or None) then; `hook_outputs`: the step returns what
    `training_step` returned (a batch-end hook may read it)."""
    if hook_outputs:
        options = dataclasses.replace(options, hook_outputs=True)
    if accumulation is None:
        return options
    return dataclasses.replace(options, accumulate_grad_batches=accumulation.get_accumulate_grad_batches(epoch))


def check_fit_loaders(loaders: FitLoaders, module, *, shards: int, limits, max_steps: int | None, accumulate: int,
                      resuming: bool, validates: bool) -> None:
    """Fit's loaders checked against the strategy's batch shards and the limits before anything
    runs; with validation on, a `limit_val_batches` fraction keeping no batch is an error now."""
    check_fit_data(loaders.train, loaders.val, shards=shards, processes=jax.process_count(), limit=limits["train"],
                   max_steps=max_steps, accumulate=accumulate, resuming=resuming)
    several = len(loaders.val) > 1
    _token_ids.check_loaders(module, [("train_data", loaders.train)] + [
        (f"val_data[{i}]" if several else "val_data", loader) for i, loader in enumerate(loaders.val)])
    if validates:
        for loader in loaders.val:
            checks.apply_limit(limits["val"], checks.maybe_len(loader), stage="val")
        check_dataloader_idx(module, "val", several=len(loaders.val) > 1)


def _as_fit_loaders(train_data, val_data, overfit: bool, module):
    if overfit:  # the same first batches every epoch: drawn in order
        train_data = _in_order(train_data, "train")
    train = with_transfer_hooks(as_loader(train_data, name="train_data"), module)
    vals = [] if val_data is None else [  # one loader or several (Lightning's list or dict)
        with_transfer_hooks(as_loader(_in_order(data, "val") if overfit else data, name=name), module, i)
        for i, (name, data) in enumerate(each_loader(val_data, name="val_data"))]
    return train, vals


class BatchPositions:
    """The train loader's state after each drawn batch of the current epoch."""

    def __init__(self) -> None:
        self._states: dict[int, Any] = {}
        self._state_fn = None  # batches drawn -> loader state, when the position is computed

    def computed(self, state_fn) -> None:
        """Positions of this epoch come from `state_fn(batches_drawn)` (nothing kept per batch)."""
        self._states, self._state_fn = {}, state_fn

    def batches(self, loader: Any, limit: int | None, *, start: int = 0, state: Any = None
                ) -> Iterator[Any]:
        """The batches of one epoch from batch `start` (0-based), up to `limit` in the epoch.

        `state` is the loader's saved position at `start` (loaded before iterating); a loader
        without states is iterated from its beginning and its first `start` batches dropped.
        """
        self._states, self._state_fn = {start: state}, None
        skip = 0
        if start and state is not None:
            loader.load_state_dict(state)
        else:
            skip = start
        stop = None if limit is None else max(limit - start, 0) + skip
        return self._track(itertools.islice(iter(loader), skip, stop), loader, start)

    def _track(self, batches: Iterable[Any], loader: Any, start: int) -> Iterator[Any]:
        stateful = callable(getattr(loader, "state_dict", None))
        for n, batch in enumerate(batches, start + 1):
            if stateful:
                self._states[n] = loader.state_dict()
                self._states.pop(n - _KEEP, None)
            yield batch

    def state_after(self, batches_done: int) -> Any:
        if self._state_fn is not None:
            return self._state_fn(batches_done)
        return self._states.get(batches_done)


class TrainFeed:
    """One fit's train data: the loader's epochs, as host batches or device blocks.

    Built with the loader, `limit_train_batches`, the strategy and the step options fit starts
    with; `keep_on_devices` decides (once the parameters exist) whether the data lives on the
    devices; `use_options` switches to another accumulation count's steps and device copy."""

    def __init__(self, loader: Any, *, limit: int | float | None, strategy, options: step_lib.StepOptions):
        self.loader = loader
        self.limit = limit
        self.strategy = strategy
        self.options = options
        self.positions = BatchPositions()
        self.device: Feed | None = None  # the train data kept on the devices, if it is
        self._kept: dict[int, tuple[Any, Any]] = {}  # accumulation count -> (train steps, device feed)

    @property
    def batches_in_epoch(self) -> int | None:
        """Train batches per epoch after `limit_train_batches` (None: the data has no length)."""
        return checks.apply_limit(self.limit, _maybe_len(self.loader))

    def first_batch(self, epoch: int) -> tuple[Batch, Iterator[Batch]]:
        """The first train batch (fit builds the state and programs from it) and the rest of
        epoch `epoch`'s batches; checks the batch size."""
        epoch_iter = self.epoch_batches(epoch)
        first = next(epoch_iter, None)
        if first is None:  # limit_train_batches=0 trains nothing, but the model is built all the same
            first = next(iter(self.loader), None)
            epoch_iter = iter(())
        if first is None:
            raise ValueError("train_data is empty: its first epoch yielded no batch.")
        self.strategy.check_batch_size(batch_size_of(first) * jax.process_count(), what="the train batch size")
        return first, epoch_iter

    def keep_on_devices(self, params: Any) -> None:
        """Keeps the data on the devices when it fits and the step is small (`fitjax.data.feed_for`)."""
        self.device = feed_for(self.loader, self.strategy, options=self.options, params=params)

    def replaced(self, loader: Any, params: Any) -> "TrainFeed":
        """The same feed over another loader (reloaded); an accumulation count's kept copy
        of the old data is dropped (those counts read from the host)."""
        feed = TrainFeed(loader, limit=self.limit, strategy=self.strategy, options=self.options)
        feed._kept = {k: (steps, None) for k, (steps, _) in self._kept.items()}
        if self.device is not None or loader is not self.loader:
            feed.keep_on_devices(params)
        return feed

    def use_options(self, options: step_lib.StepOptions, compiled: step_lib.Compiled, params: Any
                    ) -> step_lib.Compiled:
        """Switches to `options`' accumulation count: its train steps (made once per fit, so
        every count compiles once) and its device feed; returns the compiled programs to use."""
        kept = self._kept
        kept.setdefault(compiled.options.accumulate_grad_batches, (compiled.train_programs(), self.device))
        k = options.accumulate_grad_batches
        if k not in kept:
            feed = self.device and feed_for(self.loader, self.strategy, options=options,
                                                           params=params)  # blocks of whole k-calls
            kept[k] = (compiled.train_programs_for(options), feed)
        steps, self.device = kept[k]
        self.options = options
        return compiled.with_options(options, steps)

    def epoch_batches(self, epoch: int, *, start: int = 0, state: Any = None) -> Iterator[Batch]:
        """Epoch `epoch`'s train batches from batch `start` (the loader's saved `state` there)."""
        loader = self.loader
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)
        limit = checks.apply_limit(self.limit, _maybe_len(loader))
        batches = self.positions.batches(loader, limit, start=start, state=state)
        return checked_batches(loader, batches, epoch=epoch, start=start, limit=limit,
                               shards=self.strategy.num_batch_shards // jax.process_count())

    def chunks(self, epoch: int, epoch_iter: Iterator[Batch] | None, *, start: int, steps_left: int | None,
               current_step: Callable[[], jax.Array], shard_inputs: Callable) -> Iterable[step_lib.StepInputs]:
        """Epoch `epoch`'s chunks from batch `start`: picked from blocks on the devices when the
        data is kept there, else grouped from `epoch_iter` (the host batches; None: this
        epoch's, made here). A chunk is one batch unless accumulation or several steps per call
        group them."""
        if self.device is None:
            if epoch_iter is None:
                epoch_iter = self.epoch_batches(epoch)
            return _prefetch(step_lib.group_batches(epoch_iter, self.options, steps_left=steps_left), shard_inputs)
        self.loader.set_epoch(epoch)
        stop = checks.apply_limit(self.limit, len(self.loader))
        self.positions.computed(self.loader._state_at)
        return self.device.chunks(start=start, stop=stop, steps_left=steps_left, current_step=current_step)

    def hook_batch(self, chunk: step_lib.StepInputs) -> Any:
        """The batch the per-batch hooks get: host arrays, as the loader yields them (gathered
        back from the devices for a chunk kept there). The loop asks only when a hook reads it."""
        return chunk.inputs if not chunk.on_device else self.device.host_inputs(chunk)


def _prefetch(chunks: Iterable[step_lib.StepInputs], shard_inputs: Callable) -> Iterable[step_lib.StepInputs]:
    """Shards each chunk's inputs onto the devices `_PREFETCH` steps before the step that uses it.

    With one process batches stay on the host: the jitted step's `in_shardings` transfer them
    in its C++ dispatch path, which is cheaper than any Python-side prefetch.
    """
    if jax.process_count() == 1:
        return chunks
    return _prefetch_global(chunks, shard_inputs)


def _prefetch_global(chunks: Iterable[step_lib.StepInputs], shard: Callable) -> Iterator[step_lib.StepInputs]:
    queue: collections.deque = collections.deque()
    for chunk in chunks:
        queue.append(dataclasses.replace(chunk, inputs=shard(chunk.inputs, chunk.full)))
        if len(queue) > _PREFETCH - 1:
            yield queue.popleft()
    while queue:
        yield queue.popleft()
