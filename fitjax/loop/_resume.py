"""What a checkpoint records about the loop (`ResumePoint`, `fit_meta`), and the pieces of
continuing from it exactly (the load hooks, the callbacks' and loggers' states, `ckpt_path`).

A checkpoint saved once an epoch's end work is done (epoch metrics logged, validation run,
`on_train_epoch_end` called) resumes at the next epoch's first batch; one saved mid-epoch (or
after the last step but before that work) resumes at the next batch of the same epoch, so
nothing is replayed, skipped or run twice.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import jax

from fitjax import _stack, checkpoint
from fitjax.loop._host_hooks import HostHooks
from fitjax.loop.fit_run import FitRun
from fitjax.loop.metric_log import EpochAccumulators, MetricLog
from fitjax.loop.progress import Progress
from fitjax.step import pieces as pieces_lib

__all__ = ["Preempted", "ResumePoint", "call_load_hooks", "fit_meta", "load_states", "resolve_ckpt_path", "resume_fit",
           "stood_at", "warn_changed_hparams", "warn_unpositioned"]

log = logging.getLogger("fitjax")


class Preempted(Exception):
    """Raised by the loop after the step during which SIGTERM arrived; `fit` saves and returns."""


@dataclasses.dataclass(frozen=True)
class ResumePoint:
    """Where a run continues from a checkpoint taken now, as plain data: the loop's progress
    (with this position as the last saved), the epoch and the batches done in it, the train
    loader's position there and the epoch's accumulated train means.

    Once the epoch's end work has started (`epoch_end_done`) and the epoch ran out of batches
    (rather than stopping), it is the next epoch's first batch; otherwise the next batch of
    the same epoch."""

    progress: dict
    global_step: int
    epoch: int
    batches_done: int
    loader: Any = None
    epoch_acc: dict = dataclasses.field(default_factory=dict)

    @classmethod
    def at(cls, progress, *, stopped: bool, loader_state: Callable[[int], Any],
           epoch_acc: EpochAccumulators) -> "ResumePoint":
        """The point of a save at `progress` now; `stopped`: the epoch ends early (a stop
        request or `max_steps`), so its end work does not make the next epoch current."""
        done = progress.batches_done
        exhausted = done == progress.batches_in_epoch or not stopped
        whole = {**progress.state_dict(), "last_saved": progress.position.as_list()}
        if progress.epoch_end_done and exhausted:
            return cls(whole, progress.global_step, progress.epoch + 1, 0)
        return cls(whole, progress.global_step, progress.epoch, done, loader_state(done), epoch_acc.to_meta())

    def to_meta(self) -> dict[str, Any]:
        return {"global_step": self.global_step,
                "epoch": self.epoch,  # where the run resumes: this epoch, after `batches_done` batches
                "batches_done": self.batches_done,
                "progress": self.progress,  # the whole loop position, as it is at the save
                "loader": self.loader,
                "epoch_acc": self.epoch_acc}

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> "ResumePoint":
        return cls(meta.get("progress", {}), int(meta["global_step"]), int(meta["epoch"]),
                   int(meta["batches_done"]), meta["loader"], meta["epoch_acc"])

    def restore(self, progress) -> None:
        """Puts the loop's `progress` where this point stood."""
        progress.load_state_dict(self.progress)
        progress.global_step = self.global_step
        if self.epoch != progress.epoch:  # saved after the epoch's end work: the next one
            progress.end_epoch()
        progress.epoch = self.epoch

    def epoch_accumulators(self) -> EpochAccumulators:
        return EpochAccumulators.from_meta(self.epoch_acc)


def fit_meta(point: ResumePoint, module, *, callbacks, loggers, precision: str, pieces,
             save_hooks: Sequence[Any], trainer) -> dict[str, Any]:
    """The JSON item of a checkpoint taken at `point` (`Trainer.checkpoint_meta`): the resume
    point, callback and logger states, hyperparameters, and what the save hooks add."""
    hparams, not_saved = checkpoint.jsonable(dict(module.hparams))
    meta = {
        "format": 2,
        **point.to_meta(),
        "callbacks": {cb.state_key: cb.state_dict() for cb in callbacks},
        "loggers": [logger.state_dict() for logger in loggers],
        "hparams": hparams,
        "hparams_not_saved": not_saved,
        "module": f"{type(module).__module__}.{type(module).__qualname__}",
        "options": {"precision": precision},  # quoted by restore errors
        # what validation used (an EMA's average): what evaluating or loading this checkpoint uses
        "eval_params": pieces_lib.eval_params_key(pieces),
    }
    # Lightning's order: the callbacks' hooks, then the module's; what they add is saved with it
    for cb in save_hooks:
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


def resume_fit(run: FitRun, path, *, trainer, progress: Progress, metric_log: MetricLog, hooks: HostHooks,
               callbacks, loggers, precision: str) -> Iterable:
    """Restores `run`'s train state, the progress, the epoch's means, callbacks and loggers from
    checkpoint `path` (the load hooks called with `trainer`); returns the batches of the epoch
    it stopped in, from the first one not yet stepped."""
    meta = checkpoint.read_meta(path)
    if jax.process_index() == 0:  # Lightning's line, with where the run stood
        log.info(f"Restoring states from the checkpoint path at {path} {stood_at(meta)}")
    run.state = checkpoint.restore_state(path, run.state, options={"precision": precision},
                                         trains=run.module.trainable_mask(run.state.params))
    point = ResumePoint.from_meta(meta)
    point.restore(progress)
    run.resume_at = point.batches_done
    metric_log.start_epoch(point.epoch_accumulators())
    call_load_hooks(trainer, run.module, meta, hooks.overriding("on_load_checkpoint"))
    load_states(meta, callbacks, loggers)
    warn_unpositioned(path, point, run.feed.loader)
    return run.feed.epoch_batches(progress.epoch, start=point.batches_done, state=point.loader)


def call_load_hooks(trainer, module, meta: dict[str, Any], load_hooks: Sequence[Any]) -> None:
    """The `on_load_checkpoint` hooks with a checkpoint's plain-data item: the module's, then
    the callbacks' (Lightning's order)."""
    module.on_load_checkpoint(meta)
    for cb in load_hooks:
        cb.on_load_checkpoint(trainer, module, meta)


def load_states(meta: dict[str, Any], callbacks, loggers) -> None:
    """The callbacks' and loggers' states saved in a checkpoint's plain-data item, loaded."""
    states = meta["callbacks"]
    for cb in callbacks:
        if cb.state_key in states:
            cb.load_state_dict(states[cb.state_key])
    if len(meta["loggers"]) == len(loggers):
        for logger, state in zip(loggers, meta["loggers"]):
            logger.load_state_dict(state)


def warn_unpositioned(path, point: ResumePoint, loader) -> None:
    """Warns when a mid-epoch checkpoint holds no data position for a loader that has one."""
    if point.batches_done and point.loader is None and callable(getattr(loader, "state_dict", None)):
        warnings.warn(f"checkpoint {str(path)!r} holds no data position; the first {point.batches_done} "
                      "batches of the epoch are replayed from the loader and dropped.", stacklevel=_stack.user_stacklevel())


def warn_changed_hparams(path, module) -> bool:
    """Warns, and returns True, when `module`'s hyperparameters differ from those checkpoint
    `path` was saved with: the run resumed goes on with the module's, and its logger version's
    `hparams.yaml` keeps what that run was started with (the caller does not log them again)."""
    saved = checkpoint.read_meta(path).get("hparams", {})
    ours = checkpoint.jsonable(dict(module.hparams))[0]
    changed = sorted(name for name in {*saved, *ours} if saved.get(name, _MISSING) != ours.get(name, _MISSING))
    if changed:
        diff = ", ".join(f"{name}: {saved.get(name, '(none)')!r} -> {ours.get(name, '(none)')!r}" for name in changed)
        warnings.warn(f"ckpt_path {str(path)!r} was saved with other hyperparameters than this module's "
                      f"({diff}): the resumed run goes on with the module's, and its logger keeps the "
                      "hparams.yaml it was started with. Start a new run (no ckpt_path) to log them as a "
                      "run of their own.", stacklevel=_stack.user_stacklevel())
    return bool(changed)


_MISSING = object()


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
                          "from scratch.", stacklevel=_stack.user_stacklevel())
            return None
        if found is None:
            raise FileNotFoundError(
                f"{where}: ckpt_path={ckpt_path!r} found no complete checkpoint in "
                f"{[str(d) for d in callbacks[0].search_dirs(trainer)]}. Pass a checkpoint path, "
                "or ckpt_path=None to start from scratch."
            )
        return found
    return checkpoint.check_path(ckpt_path, where=where)
