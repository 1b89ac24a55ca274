"""The loop's checkpoints: `Trainer.save_checkpoint`, what a checkpoint records about the loop,
and how `fit` continues from it exactly.

The loop position is counted in batches *consumed by steps*, not drawn from the loader: the
trainer shards a batch ahead of the step that uses it, so the loader itself is one batch ahead.
`BatchPositions` keeps the loader's `state_dict()` taken right after each batch is drawn, keyed by
that batch's number in the epoch, and a save picks the state belonging to the last stepped batch.

A checkpoint saved once an epoch's end work is done (epoch metrics logged, validation run,
`on_train_epoch_end` called) resumes at the next epoch's first batch; one saved mid-epoch (or
after the last step but before that work) resumes at the next batch of the same epoch, so
nothing is replayed, skipped or run twice.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import warnings
from pathlib import Path
from typing import Any, Iterable, Iterator

from fitjax import checkpoint
from fitjax.loop import _checks as checks
from fitjax.loop.metric_log import EpochAccumulators
from fitjax.module import LitModule
from fitjax.step import pieces as pieces_lib

log = logging.getLogger("fitjax")

_KEEP = 8  # loader states kept behind the newest drawn batch (the prefetch depth is 2)


class Preempted(Exception):
    """Raised by the loop after the step during which SIGTERM arrived; `fit` saves and returns."""


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


class Checkpoints:
    """The checkpoint part of `Trainer`: a save now, and the meta every save stores."""

    def save_checkpoint(self, filepath: str | os.PathLike, weights_only: bool = False) -> None:
        """Saves the train state and the loop's progress as the checkpoint folder `filepath`,
        now (waits until it is written). Every process calls it, as in Lightning.

        `Trainer.fit(ckpt_path=filepath)` resumes from it exactly, `LitModule.load_from_checkpoint`
        reads its weights. `weights_only=True` is refused: a fitjax checkpoint is the whole
        `TrainState`, and reading the weights alone is what `load_from_checkpoint` does.
        """
        filepath = checks.checkpoint_path("save_checkpoint", filepath)
        if weights_only:
            raise ValueError("Trainer.save_checkpoint(weights_only=True) is not supported: a fitjax "
                             "checkpoint holds the whole train state; load weights only with "
                             "`LitModule.load_from_checkpoint(path)`.")
        if self.state is None or self._module_for_compiled is None:
            raise RuntimeError(f"Trainer.save_checkpoint({os.fspath(filepath)!r}) needs a train state: "
                               "call it during or after Trainer.fit.")
        path = checkpoint.local_path(filepath)  # a local folder or a store URL
        if path.exists():
            raise FileExistsError(f"Trainer.save_checkpoint: {str(path)!r} exists; pass a new folder name.")
        checkpoint.prepare(path.parent)
        writer = checkpoint.writer()  # the process's one writer, after the saves queued before
        self.record_save()
        writer.save(path, self.state, self.checkpoint_meta(self._module_for_compiled))
        writer.wait()  # written (and its failure raised) before returning

    def checkpoint_meta(self, module: LitModule) -> dict[str, Any]:
        """What a checkpoint taken now stores besides the train state, as plain (JSON) data: the
        loop's progress (with this position as the last saved), the data position, callback and
        logger states, hyperparameters. A read: it changes nothing (`record_save` acts)."""
        return fit_meta(self, module)

    def record_save(self) -> None:
        """Readies the loop for a checkpoint of the current position, before `checkpoint_meta`:
        the train log window on its way is logged (its rows reach the loggers and the epoch's
        means, which the checkpoint holds), and the position becomes the last saved one
        (`trainer.progress.last_saved`). Whoever saves calls it, as `ModelCheckpoint` does."""
        self._metric_log.finish_windows()
        self._progress.last_saved = self._progress.position


def fit_meta(trainer, module) -> dict[str, Any]:
    """The JSON item of a checkpoint taken now (`Trainer.checkpoint_meta`).

    Where it resumes follows from the progress: once the epoch's end work has started
    (`epoch_end_done`) and the epoch ran out of batches (rather than stopping), the next epoch's
    first batch; otherwise the next batch of the same epoch."""
    progress = trainer._progress
    done = progress.batches_done
    exhausted = done == progress.batches_in_epoch or not (
        trainer.should_stop or (trainer.max_steps is not None and progress.global_step >= trainer.max_steps)
    )
    if progress.epoch_end_done and exhausted:
        epoch, batches, loader_state, epoch_acc = progress.epoch + 1, 0, None, {}
    else:
        epoch, batches = progress.epoch, done
        loader_state = trainer._positions.state_after(done)
        epoch_acc = trainer._metric_log.epoch_accumulators.to_meta()
    hparams, not_saved = checkpoint.jsonable(dict(module.hparams))
    meta = {
        "format": 2,
        "global_step": progress.global_step,
        "epoch": epoch,  # where the run resumes: this epoch, after `batches_done` batches
        "batches_done": batches,
        # the whole loop position, as it is at the save (which is then the last saved)
        "progress": {**progress.state_dict(), "last_saved": progress.position.as_list()},
        "loader": loader_state,
        "epoch_acc": epoch_acc,
        "callbacks": {cb.state_key: cb.state_dict() for cb in trainer.callbacks},
        "loggers": [logger.state_dict() for logger in trainer.loggers],
        "hparams": hparams,
        "hparams_not_saved": not_saved,
        "module": f"{type(module).__module__}.{type(module).__qualname__}",
        "options": {"precision": trainer.precision},  # quoted by restore errors
        # what validation used (an EMA's average): what evaluating or loading this checkpoint uses
        "eval_params": pieces_lib.eval_params_key(trainer.step_options.pieces),
    }
    # Lightning's order: the callbacks' hooks, then the module's; what they add is saved with it
    for cb in trainer._hooks.overriding("on_save_checkpoint"):
        cb.on_save_checkpoint(trainer, module, meta)
    module.on_save_checkpoint(meta)
    _check_plain(meta, module)
    return meta


def _check_plain(meta: dict[str, Any], module) -> None:
    """Raises naming the keys whose values are not JSON data (an `on_save_checkpoint` hook's)."""
    bad = []
    for key, value in meta.items():
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            bad.append(key)
    if bad:
        raise TypeError(
            f"a checkpoint's plain-data item holds values that are not JSON data under {bad} "
            f"(added by an on_save_checkpoint hook of {type(module).__name__} or a callback?): store "
            "numbers, strings, lists and dicts there (`array.tolist()` for a small array); arrays "
            "that belong to the run go in the train state.")


def call_load_hooks(trainer, module, meta: dict[str, Any]) -> None:
    """The `on_load_checkpoint` hooks with a checkpoint's plain-data item: the module's, then
    the callbacks' (Lightning's order)."""
    module.on_load_checkpoint(meta)
    for cb in trainer._hooks.overriding("on_load_checkpoint"):
        cb.on_load_checkpoint(trainer, module, meta)


def resume_fit(trainer, module, loader: Any, path: Path) -> Iterator[Any]:
    """Restores `trainer.state`, the progress, callbacks and loggers from `path`; returns the
    batches of the epoch the checkpoint stopped in, from the first one not yet stepped."""
    meta = checkpoint.read_meta(path)
    if trainer.is_global_zero:  # Lightning's line, with where the run stood
        log.info(f"Restoring states from the checkpoint path at {path} {stood_at(meta)}")
    trainer.state = checkpoint.restore_state(path, trainer.state, options={"precision": trainer.precision})
    progress = trainer._progress
    progress.load_state_dict(meta.get("progress", {}))
    progress.global_step = int(meta["global_step"])
    if int(meta["epoch"]) != progress.epoch:  # saved after the epoch's end work: the next one
        progress.end_epoch()
    progress.epoch = int(meta["epoch"])
    trainer._resume_at = start = int(meta["batches_done"])
    trainer._metric_log.start_epoch(EpochAccumulators.from_meta(meta["epoch_acc"]))
    call_load_hooks(trainer, module, meta)
    states = meta["callbacks"]
    for cb in trainer.callbacks:
        if cb.state_key in states:
            cb.load_state_dict(states[cb.state_key])
    if len(meta["loggers"]) == len(trainer.loggers):
        for logger, state in zip(trainer.loggers, meta["loggers"]):
            logger.load_state_dict(state)
    state = meta["loader"]
    if start and state is None and callable(getattr(loader, "state_dict", None)):
        warnings.warn(f"checkpoint {str(path)!r} holds no data position; the first {start} "
                      "batches of the epoch are replayed from the loader and dropped.", stacklevel=3)
    return trainer._epoch_batches(loader, progress.epoch, start=start, state=state)


def stood_at(meta: dict) -> str:
    """Where a checkpoint's run stood: "(global step S; epoch E from batch B)", the position a
    resume continues from (a checkpoint saved at an epoch's end continues in the next epoch)."""
    return (f"(global step {int(meta['global_step'])}; epoch {int(meta['epoch'])} from batch "
            f"{int(meta.get('batches_done', 0))})")


def resolve_ckpt_path(trainer, ckpt_path: Any, *, where: str) -> Path | None:
    """`ckpt_path` ("last", "best", a path or None) as a checkpoint folder (or None)."""
    if ckpt_path is None:
        return None
    if ckpt_path in ("last", "best"):
        callbacks = trainer.checkpoint_callbacks
        if not callbacks:
            raise ValueError(
                f"{where}: ckpt_path={ckpt_path!r} needs a ModelCheckpoint callback, and this "
                "trainer has none (enable_checkpointing=False). Pass a checkpoint path instead."
            )
        found = callbacks[0].find(ckpt_path, trainer)
        if found is None and ckpt_path == "last":  # Lightning: an "always resume" script's first run
            warnings.warn(f"{where}: ckpt_path='last' found no checkpoint in "
                          f"{[str(d) for cb in callbacks for d in cb.search_dirs(trainer)]}; starting "
                          "from scratch.", stacklevel=3)
            return None
        if found is None:
            raise FileNotFoundError(
                f"{where}: ckpt_path={ckpt_path!r} found no complete checkpoint in "
                f"{[str(d) for d in callbacks[0].search_dirs(trainer)]}. Pass a checkpoint path, "
                "or ckpt_path=None to start from scratch."
            )
        return found
    return checkpoint.check_path(ckpt_path, where=where)
