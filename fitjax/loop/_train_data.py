"""The train data as the fit loop consumes it: the loaders from `fit`'s arguments, an epoch's
batches (from a resume position), grouped into chunks for one call of the train step each,
picked on the devices when the data is kept there, else prefetched onto them.

`TrainData` is a part of `Trainer` (it reads the trainer's limits, strategy, step options and
batch positions); it lives here so that `trainer.py` reads as the fit loop's outline.
"""

from __future__ import annotations

import collections
import dataclasses
import warnings
from typing import Any, Iterable, Iterator

import jax

from fitjax import step as step_lib
from fitjax._typing import Batch
from fitjax.data import as_loader, batch_size_of
from fitjax.data import checked_batches, each_loader, feed_for, unshuffled
from fitjax.loop import _arguments
from fitjax.loop import _checks as checks
from fitjax.loop._checks import maybe_len as _maybe_len

__all__ = ["TrainData"]

_PREFETCH = 2  # batches sharded onto devices ahead of the step that consumes them


def _in_order(data, prefix: str):
    data, changed = unshuffled(data)
    if changed:  # Lightning's warning, word for word
        warnings.warn(f"You requested to overfit but enabled {prefix} dataloader shuffling. We are turning "
                      f"off the {prefix} dataloader shuffling for you.", UserWarning, stacklevel=4)
    return data


class TrainData:
    """The train data part of `Trainer`: fit's loaders, an epoch's batches and chunks."""

    def _fit_loaders(self, module, train_data, val_data, datamodule):
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
        # where `reload_dataloaders_every_n_epochs` asks again: the hooks the loaders came from
        source = datamodule if datamodule is not None else module
        self._loader_hooks = {
            "train": getattr(source, "train_dataloader", None) if from_hooks[0] else None,
            "val": getattr(source, "val_dataloader", None) if from_hooks[1] and val_data is not None else None,
        }
        return self._as_fit_loaders(train_data, val_data)

    def _as_fit_loaders(self, train_data, val_data):
        if self.overfit_batches:  # the same first batches every epoch: drawn in order
            train_data = _in_order(train_data, "train")
        train = as_loader(train_data, name="train_data")
        vals = [] if val_data is None else [  # one loader or several (Lightning's list or dict)
            as_loader(_in_order(data, "val") if self.overfit_batches else data, name=name)
            for name, data in each_loader(val_data, name="val_data")]
        return train, vals

    def _reload_due(self, loaded_at: int) -> bool:
        n = self.reload_dataloaders_every_n_epochs
        return bool(n) and self.current_epoch - loaded_at >= n and any(self._loader_hooks.values())

    def _reload_loaders(self, train_loader, val_loaders):
        """The loaders asked for again from the hooks they came from (Lightning's
        `reload_dataloaders_every_n_epochs`), with the epoch's batch count and device feed."""
        hooks = self._loader_hooks
        train_data = hooks["train"]() if hooks["train"] else train_loader
        train, val = self._as_fit_loaders(train_data, hooks["val"]() if hooks["val"] else None)
        val = val if hooks["val"] else val_loaders
        self._progress.batches_in_epoch = checks.apply_limit(self.limits["train"], _maybe_len(train))
        if self._feed is not None or train is not train_loader:
            self._feed = feed_for(train, self.strategy, options=self.step_options,
                                                 params=self.state.params)
            # another schedule count's kept feed held the old data: those counts read from the host
            self._accumulation_steps = {k: (steps, None) for k, (steps, _) in self._accumulation_steps.items()}
        return train, val

    def _set_epoch_accumulation(self, train_loader) -> None:
        """With an accumulation schedule: the step options, train steps and device feed of the
        current epoch's count (`train_loader` None: before the steps are built). Each count's
        steps are made once per fit and kept, so every count compiles once."""
        if self._accumulation is None:
            return
        k = self._accumulation.get_accumulate_grad_batches(self.current_epoch)
        if k == self.step_options.accumulate_grad_batches:
            return
        options = dataclasses.replace(self.step_options, accumulate_grad_batches=k)
        self.step_options = options
        if train_loader is None:
            return
        kept = self._accumulation_steps  # count -> (train steps, device feed), made once each
        kept.setdefault(self._compiled.options.accumulate_grad_batches, (self._compiled.train_programs(), self._feed))
        if k not in kept:
            feed = self._feed and feed_for(train_loader, self.strategy, options=options,
                                                          params=self.state.params)  # blocks of whole k-calls
            kept[k] = (self._compiled.train_programs_for(options), feed)
        steps, self._feed = kept[k]
        self._compiled = self._compiled.with_options(options, steps)

    def _first_batch(self, train_loader) -> tuple[Batch, Iterator[Batch]]:
        """The first train batch (fit builds the state and programs from it) and the rest of the
        current epoch's batches; checks the batch size and counts the epoch's batches."""
        epoch_iter = self._epoch_batches(train_loader, self.current_epoch)
        first = next(epoch_iter, None)
        if first is None:  # limit_train_batches=0 trains nothing, but the model is built all the same
            first = next(iter(train_loader), None)
            epoch_iter = iter(())
        if first is None:
            raise ValueError("train_data is empty: its first epoch yielded no batch.")
        self.strategy.check_batch_size(batch_size_of(first) * jax.process_count(), what="the train batch size")
        self._progress.batches_in_epoch = checks.apply_limit(self.limits["train"], _maybe_len(train_loader))
        self._train_size_known = True
        return first, epoch_iter

    def _epoch_batches(self, loader, epoch: int, *, start: int = 0, state: Any = None) -> Iterator[Batch]:
        """Epoch `epoch`'s train batches from batch `start` (the loader's saved `state` there)."""
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)
        limit = checks.apply_limit(self.limits["train"], _maybe_len(loader))
        batches = self._positions.batches(loader, limit, start=start, state=state)
        return checked_batches(loader, batches, epoch=epoch, start=start, limit=limit,
                               shards=self.strategy.num_batch_shards // jax.process_count())

    def _train_chunks(self, loader, epoch_iter: Iterator[Batch] | None, *, start: int,
                      steps_left: int | None) -> Iterable[step_lib.StepInputs]:
        """The current epoch's chunks from batch `start`: picked from blocks on the devices when
        the data is kept there (`data._device_blocks`), else grouped from `epoch_iter` (the host batches;
        None: this epoch's, made here)."""
        if self._feed is None:
            if epoch_iter is None:
                epoch_iter = self._epoch_batches(loader, self.current_epoch)
            return self._prefetch(step_lib.group_batches(epoch_iter, self.step_options, steps_left=steps_left))
        loader.set_epoch(self.current_epoch)
        stop = checks.apply_limit(self.limits["train"], len(loader))
        self._positions.computed(loader._state_at)
        return self._feed.chunks(start=start, stop=stop, steps_left=steps_left,
                                 current_step=lambda: self.state.step)

    def _hook_batch_maker(self):
        """`chunk -> the batch the per-batch hooks get`: host arrays, as the loader yields them;
        None for a chunk on the devices when every hook that runs ignores the batch."""
        needs = (self._hooks.needs_batch("on_train_batch_start")
                 or self._hooks.needs_batch("on_train_batch_end"))

        def hook_batch(chunk: step_lib.StepInputs) -> Any:
            if not chunk.on_device:
                return chunk.inputs
            return self._feed.host_inputs(chunk) if needs else None

        return hook_batch

    def _prefetch(self, chunks: Iterable[step_lib.StepInputs]) -> Iterable[step_lib.StepInputs]:
        """Shards each chunk's inputs onto the devices `_PREFETCH` steps before the step that uses it.

        With one process batches stay on the host: the jitted step's `in_shardings` transfer them
        in its C++ dispatch path, which is cheaper than any Python-side prefetch.
        """
        if jax.process_count() == 1:
            return chunks
        return self._prefetch_global(chunks)

    def _prefetch_global(self, chunks: Iterable[step_lib.StepInputs]) -> Iterator[step_lib.StepInputs]:
        queue: collections.deque = collections.deque()
        shard = self._compiled.shard_inputs
        for chunk in chunks:
            queue.append(dataclasses.replace(chunk, inputs=shard(chunk.inputs, chunk.full)))
            if len(queue) > _PREFETCH - 1:
                yield queue.popleft()
        while queue:
            yield queue.popleft()
