"""`ModelCheckpoint`: Lightning's checkpoint callback, writing Orbax checkpoints off the loop's thread.

A save costs the loop a host copy of the state (see `fitjax.checkpoint._writer` and
`benchmarks/checkpoint.py`): every save of the process, of every checkpoint callback, goes through
the process's one writer, in order; a save at a later step, and the end of fit, wait for the ones
queued. Any number of checkpoint callbacks work together, each with its own bookkeeping.
Which saves are kept follows Lightning: the `save_top_k` best by `monitor` (the newest without
one), plus the newest with `save_last`; a save that would be neither is not written at all.
With `Trainer(runs=...)` a save holds every run and is scored per run (`monitor/run_<i>`): it is
kept while it is among the `save_top_k` best of any run, so each run has its own best.
"""

from __future__ import annotations

import datetime
import logging
import math
import os
import re
import time
import warnings
from pathlib import Path
from typing import Any

from fitjax import _safe_names, _stack, _storage, checkpoint
from fitjax.runs import run_suffix
from fitjax.strategies import broadcast_str
from fitjax.callbacks import _ranking
from fitjax.callbacks._base import Callback, ignores_batch, ignores_outputs, plain_hook

__all__ = ["ModelCheckpoint"]

log = logging.getLogger("fitjax")

_FIELD = re.compile(r"\{([^{}:]+)(:[^{}]*)?\}")


class ModelCheckpoint(Callback):
    """Saves the whole train state (and where the loop stood) as Orbax checkpoints during fit.

    Arguments and their meanings follow Lightning's `ModelCheckpoint`. Each checkpoint is a
    folder `<dirpath>/<filename>`; see `fitjax.checkpoint` for what it holds and how to read it
    with Orbax alone.

    Args:
        dirpath: where to save; default `<logger.log_dir>/checkpoints`, or
            `<default_root_dir>/checkpoints` without a logger.
        filename: a template of metric names, e.g. `"{epoch}-{val/loss:.3f}"` gives
            `epoch=3-val_loss=0.123-step=32` (`/` becomes `_`; `-step=<n>` is appended when
            the template has no `{step}`). Default `"{epoch}-{step}"`.
        monitor: a logged metric ranking the saves (e.g. `"val/loss"`); None keeps the newest.
        mode: "min" or "max": which values of `monitor` are better.
        save_top_k: how many saves to keep (the best by `monitor`, else the newest); -1 keeps
            all, 0 none (only the last with `save_last`).
        save_last: also keep the newest save, whatever its score (`last_model_path`).
        every_n_train_steps: save every this many optimizer steps.
        every_n_epochs: save at the end of every this many epochs (default 1 when neither
            `every_n_train_steps` nor `train_time_interval` is given).
        train_time_interval: save when this much time (a `datetime.timedelta`) has passed since
            the last save, checked after each step.
        save_on_exception: save when fit raises (the error still reaches the caller).
        verbose: print a line per save.
        weights: "all" (default) saves every parameter; "trainable" only those the optimizer
            trains (`apply_lora`'s adapters, the groups `fj.param_groups` does not freeze), with
            their optimizer state and the loop position, and a fingerprint of each frozen array:
            a small checkpoint that resumes a fit (bitwise, mid-epoch) whose module is given the
            same base weights again, and fails naming the arrays when they differ.

    After fit: `best_model_path`, `best_model_score`, `last_model_path`.

    With `Trainer(runs=...)` and a `monitor` the runs log each under their own key
    (`monitor="val/loss"`: `val/loss/run_<i>`), every save holds all runs and each run is
    ranked on its own value: a save is kept while it is among the `save_top_k` best of any
    run. `best_model_paths[i]` and `best_model_scores[i]` are run i's best
    (`LitModule.load_from_checkpoint(ckpt.best_model_paths[i], run=i)` loads its weights);
    `best_model_path`/`best_model_score` the best of all runs', and `best_k_models` maps each
    kept path to its scores per run. A monitor naming one run (`"val/loss/run_0"`) ranks by it.

    Example:
        >>> import fitjax as fj
        >>> ckpt = fj.ModelCheckpoint(monitor="val/loss", save_top_k=2, filename="{epoch}-{val/loss:.3f}")
        >>> trainer = fj.Trainer(max_epochs=5, callbacks=[ckpt])
        >>> # trainer.fit(module, train, val); ckpt.best_model_path
        >>> # trainer.fit(module, train, val, ckpt_path="last")   # resumes exactly
    """

    def __init__(
        self,
        dirpath: str | os.PathLike | None = None,
        filename: str | None = None,
        monitor: str | None = None,
        *,
        mode: str = "min",
        save_top_k: int = 1,
        save_last: bool = False,
        every_n_train_steps: int | None = None,
        every_n_epochs: int | None = None,
        train_time_interval: datetime.timedelta | None = None,
        save_on_exception: bool = False,
        verbose: bool = False,
        weights: str = "all",
    ):
        if mode not in ("min", "max"):
            raise ValueError(f"ModelCheckpoint(mode=...) must be 'min' or 'max', got {mode!r}")
        if not isinstance(save_top_k, int) or isinstance(save_top_k, bool) or save_top_k < -1:
            raise ValueError(f"ModelCheckpoint(save_top_k=...) must be an int >= -1, got {save_top_k!r}")
        for name, value in (("every_n_train_steps", every_n_train_steps), ("every_n_epochs", every_n_epochs)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise ValueError(f"ModelCheckpoint({name}=...) must be an int >= 0 or None, got {value!r}")
        if train_time_interval is not None and not isinstance(train_time_interval, datetime.timedelta):
            raise TypeError("ModelCheckpoint(train_time_interval=...) takes a datetime.timedelta, got "
                            f"{train_time_interval!r}; e.g. datetime.timedelta(minutes=30).")
        if weights not in ("all", "trainable"):
            raise ValueError(f"ModelCheckpoint(weights=...) must be 'all' (every parameter) or 'trainable' (the "
                             f"parameters the optimizer trains, e.g. LoRA's adapters, without the frozen base); "
                             f"got {weights!r}.")
        if filename is not None and (not isinstance(filename, str) or not filename):
            raise ValueError(f"ModelCheckpoint(filename=...) must be a non-empty str template, got {filename!r}")
        # `~` expanded and made absolute now, as Lightning does: saves, best/last paths and
        # resume lookups do not depend on a later working directory.
        self.dirpath = checkpoint.local_path(dirpath) if dirpath is not None else None
        self.filename = filename or "{epoch}-{step}"
        self.monitor = monitor
        self.mode = mode
        self.save_top_k = save_top_k
        self.save_last = bool(save_last)
        self.every_n_train_steps = every_n_train_steps or 0
        self.train_time_interval = train_time_interval
        if every_n_epochs is None:
            every_n_epochs = 0 if (self.every_n_train_steps or train_time_interval) else 1
        self.every_n_epochs = every_n_epochs
        self.save_on_exception = bool(save_on_exception)
        self.verbose = verbose
        self.weights = weights
        self._frozen: dict[str, list[int]] | None = None  # weights="trainable": this fit's base fingerprints
        self.best_model_path = ""
        self.best_model_score: float | None = None
        self.last_model_path = ""
        self.current_score: float | None = None  # the monitored value at the last save
        # This run's checkpoints still on disk, oldest first: path -> score (None: unscored; a
        # tuple of each run's with `Trainer(runs=...)`). Restored on resume, so a resumed run
        # ranks and deletes its own saves, never another run's.
        self._kept: dict[str, float | tuple[float, ...] | None] = {}
        self._writer: checkpoint.CheckpointWriter | None = None  # set during fit
        self._saved_steps: set[int] = set()  # global steps saved during this fit
        self._validated_at: int | None = None  # global step of this fit's last validation
        self._resumed = False
        self._restoring: dict[str, Any] | None = None  # a loaded state whose dirpath is checked at fit start
        self._held: Path | None = None  # the folder whose lease this fit holds (`checkpoint.hold_folder`)
        self._failing = False
        self._warned_missing = False
        self._last_time = time.monotonic()
        self._deferred = False
        self._listed: set[str] | None = None  # a store folder's names at fit start, and this fit's saves

    @property
    def best_k_models(self) -> dict[str, float | tuple[float, ...]]:
        """The kept checkpoints ranked by `monitor`: path -> score (Lightning's `best_k_models`;
        with `Trainer(runs=...)`, a tuple of each run's score)."""
        return {path: score for path, score in self._kept.items() if score is not None}

    @property
    def best_model_paths(self) -> list[str]:
        """Each run's best checkpoint (`Trainer(runs=...)`; one run: `[best_model_path]`)."""
        return [path for path, _ in self._best_per_run()]

    @property
    def best_model_scores(self) -> list[float | None]:
        """Each run's best score (`Trainer(runs=...)`; one run: `[best_model_score]`)."""
        return [score for _, score in self._best_per_run()]

    def _best_per_run(self) -> list[tuple[str, float | None]]:
        scored = self.best_k_models
        if not scored or not isinstance(next(iter(scored.values())), tuple):
            return [(self.best_model_path, self.best_model_score)]
        return [_ranking.best(run, self.mode) for run in _ranking.per_run(scored)]

    @property
    def state_key(self) -> str:
        """Lightning's key (the monitor and when saves happen), and the filename template: several
        checkpoint callbacks in one Trainer need different keys (checked when it is made)."""
        interval = None if self.train_time_interval is None else self.train_time_interval.total_seconds()
        return (f"ModelCheckpoint{{'monitor': {self.monitor!r}, 'mode': {self.mode!r}, "
                f"'every_n_train_steps': {self.every_n_train_steps}, 'every_n_epochs': {self.every_n_epochs}, "
                f"'train_time_interval': {interval}, 'filename': {self.filename!r}}}")

    # ------------------------------------------------------------------------------ where

    def resolve_dirpath(self, trainer) -> Path:
        """The folder, decided on process 0 (a logger's version folder is only predicted on the
        others) and shared with every process, which all write the checkpoint with Orbax."""
        if self.dirpath is None:
            log_dir = trainer.log_dir
            local = checkpoint.local_path(log_dir if log_dir is not None else trainer.default_root_dir) / "checkpoints"
            self.dirpath = _storage.as_path(broadcast_str(str(local)))
        if self._restoring is not None:
            self._restore_kept()
        return self.dirpath

    def search_dirs(self, trainer) -> list[Path]:
        """Where `ckpt_path="last"/"best"` looks: the dirpath; else the logger's version when
        one is named (`CSVLogger(version=3)`), or every version of its experiment folder (the
        run a resume belongs to is then told by its module, `find`)."""
        if self.dirpath is not None:
            return [self.dirpath]
        logger = trainer.logger
        runs = None
        if hasattr(logger, "given_version"):  # a versioned run folder (`CSVLogger`, `TensorBoardLogger`)
            if logger.given_version is not None:
                return [checkpoint.local_path(logger.log_dir) / "checkpoints"]
            # the experiment folder, not `log_dir`'s parent: asking for `log_dir` before fit's
            # `claim_version` would pick a version that claim then does not take atomically
            runs = checkpoint.local_path(logger.save_dir) / logger.name
        elif logger is not None and logger.log_dir is not None:
            runs = checkpoint.local_path(logger.log_dir).parent
        if runs is not None:
            return sorted(runs.glob("*/checkpoints")) if runs.is_dir() else []
        return [checkpoint.local_path(trainer.default_root_dir) / "checkpoints"]

    def find(self, which: str, trainer) -> Path | None:
        """The newest intact checkpoint ("last"), or the best scored one ("best").

        "last" is the most recently saved complete checkpoint that reads back, in the
        `search_dirs` of every checkpoint callback of `trainer` (Lightning's rule), saved by
        the class of the trainer's module: another experiment's newer checkpoints in the same
        logger folder are skipped, with a warning naming them. A damaged newer one is skipped
        with a warning naming both.
        """
        if which == "best":
            if self.best_model_path and checkpoint.is_checkpoint(self.best_model_path):
                return _storage.as_path(self.best_model_path)
            if self.monitor is not None:
                scored = [(score, str(path)) for path in self._candidates(trainer)
                          if (score := _saved_score(path, self.monitor, self.mode)) is not None]
                if scored:
                    return _storage.as_path((min if self.mode == "min" else max)(scored)[1])
        damaged: checkpoint.CheckpointDamaged | None = None
        others = trainer.checkpoint_callbacks if trainer is not None else [self]
        dirs = list(dict.fromkeys(d for cb in [self, *others] for d in cb.search_dirs(trainer)))
        # a folder missing its meta (or state) has no saved time: its files' time ranks it
        incomplete = sorted(checkpoint.incomplete_checkpoints(dirs), key=lambda found: found[2])
        module = trainer.lightning_module if trainer is not None else None
        foreign: list[tuple[Path, str]] = []  # newer checkpoints of another module: another run's
        for path in checkpoint.checkpoints_newest_first(dirs):
            saved_by = checkpoint.read_meta(path).get("module", "")
            if module is not None and not _same_class(saved_by, module):
                foreign.append((path, saved_by))
                continue
            _warn_foreign(which, foreign, module)
            try:
                checkpoint.verify(path)
            except checkpoint.CheckpointDamaged as error:
                damaged = damaged or error  # the newest one's damage is the one to report
                continue
            if damaged is None and incomplete and incomplete[-1][2] > _saved_time(path):
                damaged = checkpoint.CheckpointDamaged(
                    f"checkpoint {str(incomplete[-1][0])!r} is damaged: {incomplete[-1][1]}.")
            if damaged is not None:
                warnings.warn(f"ckpt_path={which!r}: {damaged} Resuming from {str(path)!r}, the newest "
                              "intact checkpoint, instead.", stacklevel=_stack.user_stacklevel())
            return path
        _warn_foreign(which, foreign, module)
        if damaged is None and incomplete:
            damaged = checkpoint.CheckpointDamaged(
                f"checkpoint {str(incomplete[-1][0])!r} is damaged: {incomplete[-1][1]}.")
        if damaged is not None:
            raise damaged
        return None

    def _candidates(self, trainer) -> list[Path]:
        return checkpoint.checkpoints_newest_first(self.search_dirs(trainer))

    # ------------------------------------------------------------------------------ hooks

    def on_fit_start(self, trainer, module) -> None:
        directory = self.resolve_dirpath(trainer)  # here, where every process is: it may be a collective
        checkpoint.prepare(directory)  # writable (a store: reachable): an error now, not at the first save
        self._hold(trainer, directory)  # no other fit running on this folder: its saves are ours to clean
        entries = checkpoint.folder_entries(directory)  # on a store: one listing, retried
        if (trainer.is_global_zero and not self._resumed and self.save_top_k != 0
                and any(checkpoint.is_checkpoint(p) for p in entries)):
            warnings.warn(f"Checkpoint directory {str(directory)!r} exists and holds checkpoints: this "
                          "run saves next to them under new names ('-v1', ...) and never deletes them.",
                          stacklevel=_stack.user_stacklevel())
        removed = checkpoint.cleanup(directory)  # what interrupted saves and deletions left
        self._writer = checkpoint.writer()
        # a store's folder is listed once: a name check per save would be a request on the loop's thread
        self._listed = None
        if _storage.is_url(directory):
            self._listed = {p.name for p in entries} - {p.name for p in removed}
        self._saved_steps, self._validated_at, self._failing = set(), None, False
        self._frozen = None
        self._last_time = time.monotonic()
        self._deferred = False

    def on_train_start(self, trainer, module) -> None:
        # the train step compiles next (a second or more, mostly outside Python): Orbax is
        # imported meanwhile rather than by the first save (the MNIST port's first save: ~0.16 s
        # of which ~0.11 s was the import)
        checkpoint.import_orbax_soon()

    @plain_hook  # logs nothing, calls no model: called directly at every step
    @ignores_outputs
    @ignores_batch
    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        if self._writer is not None:
            self._writer.raise_failure()  # a save that failed on the writer thread: raised here
        due = trainer.progress.crossed(self.every_n_train_steps)  # several steps per call included
        if self.train_time_interval is not None:
            # Clocks differ between hosts: the processes agree (a small collective per step, paid
            # only when train_time_interval is set and several processes run).
            late = time.monotonic() - self._last_time >= self.train_time_interval.total_seconds()
            due = due or trainer.agree(late)
        if not due:
            return
        if batch_idx + 1 == trainer.num_training_batches:
            self._deferred = True  # the epoch's end is next: save after it, at the same step
        else:
            self._save(trainer, module)

    def on_validation_end(self, trainer, module) -> None:
        if self._writer is None or trainer.sanity_checking:
            return  # trainer.validate(), not fit; or the sanity check before training
        self._validated_at = trainer.global_step  # the monitored value is fresh at this step
        # A validation inside the epoch (val_check_interval): Lightning saves after it.
        if (not self._save_on_train_epoch_end(trainer) and self._epoch_due(trainer)
                and trainer.progress.batches_done != trainer.num_training_batches):
            self._save(trainer, module)

    def on_train_epoch_end(self, trainer, module) -> None:
        due = self._epoch_due(trainer)
        if due and not self._save_on_train_epoch_end(trainer):
            # Lightning saves on validation end here: only when this epoch's end validated.
            due = self._validated_at == trainer.global_step
        if due or self._deferred:
            self._deferred = False
            self._save(trainer, module)

    def _epoch_due(self, trainer) -> bool:
        return bool(self.every_n_epochs) and (trainer.current_epoch + 1) % self.every_n_epochs == 0

    def _save_on_train_epoch_end(self, trainer) -> bool:
        """Lightning's rule: save at the train epoch's end only when validation runs at every
        epoch's end (or never); otherwise after validation, when the monitored value is new.

        One deviation: with `check_val_every_n_epoch` > 1 and no validation data, Lightning
        never saves; here, once a validation was due and none ran, epoch ends save.
        """
        every = trainer.check_val_every_n_epoch
        if every != 1:
            due = every is not None and trainer.current_epoch + 1 >= every
            return due and self._validated_at is None
        if not any(n is None or n > 0 for n in trainer.num_val_batches):  # Lightning: sum(...) == 0
            return True
        return trainer.val_check_interval in (None, 1.0)

    def save_at_stop(self, trainer, module) -> None:
        """Called by the `Trainer` when a stop request is obeyed between two batches of an
        epoch: the save a resumed fit finishes that epoch from (its end, and the save there, come
        in that fit). It is kept until this run's next save and takes no part in the top-k
        ranking: no validation measured these weights."""
        if self.save_top_k != 0 or self.save_last:
            self._save(trainer, module, always=True, unscored=True)

    def on_exception(self, trainer, module, exception: BaseException) -> None:
        self._failing = True
        if isinstance(exception, KeyboardInterrupt):  # the waits below give up on a stalled store
            checkpoint.writer().signalled("Ctrl-C")
        if trainer.received_sigterm or self.save_on_exception:
            self._save_where_stopped(trainer, module)

    def _save_where_stopped(self, trainer, module) -> None:
        """Saves the state fit stopped at, unless there is none yet or a step interrupted twice
        holds it (its buffers donated): then the checkpoints before stay, said in a warning."""
        if trainer.state is None:
            return
        if checkpoint.is_donated(trainer.state):
            log.warning("fitjax: no checkpoint saved at step %d: the state was inside a step that did not "
                        "return (interrupted twice). The newest checkpoint is %s.", trainer.global_step,
                        self.last_model_path or "none")
            return
        self._save(trainer, module, always=True)

    def on_fit_end(self, trainer, module) -> None:
        if self._writer is not None:
            self._writer.wait()  # the last save is complete (or its failure raised) when fit returns

    def teardown(self, trainer, module, stage: str) -> None:
        writer, self._writer = self._writer, None
        try:
            if writer is not None:
                writer.wait()
        except Exception:
            if not self._failing:  # never hide the exception fit is already raising
                raise
        finally:
            held, self._held = self._held, None
            if held is not None:
                checkpoint.release_folder(held)

    def _hold(self, trainer, directory: Path) -> None:
        """Takes this fit's lease on `directory` (process 0), or raises `FolderInUse` naming the
        fit running there, on every process."""
        refused = ""
        if trainer.is_global_zero:
            try:
                checkpoint.hold_folder(directory)
                self._held = directory
            except checkpoint.FolderInUse as error:
                refused = str(error)
        refused = broadcast_str(refused)  # every process stops, not process 0 alone
        if refused:
            raise checkpoint.FolderInUse(refused)

    # ------------------------------------------------------------------------------ saving

    def _save(self, trainer, module, *, always: bool = False, unscored: bool = False) -> None:
        step = trainer.global_step
        if step in self._saved_steps:
            return  # already saved at this step (Lightning skips it too)
        score, ranked = (None, False) if unscored and self.monitor is not None else self._score(trainer)
        keep_new = always or self.save_last or (ranked and self._ranks_in_top_k(score))
        if not keep_new:
            return
        self.resolve_dirpath(trainer)
        writer = self._writer = checkpoint.writer()
        writer.raise_failure()  # a failed earlier save: its undo runs before the ranking below

        path = str(self.dirpath / self._unique_name(trainer))
        before = (dict(self._kept), self.best_model_path, self.best_model_score, self.last_model_path,
                  self.current_score)
        self.current_score = score
        self._kept[path] = score if ranked else None
        keep = self._keep(newest=path, always=always)
        dropped = [p for p in self._kept if p not in keep]
        self._kept = {p: v for p, v in self._kept.items() if p in keep}
        self.last_model_path = path
        self._update_best(path if ranked or self.monitor is None else None)

        def undo() -> None:  # the save failed: never name a folder that does not exist
            (self._kept, self.best_model_path, self.best_model_score, self.last_model_path,
             self.current_score) = before

        try:  # an error or Ctrl-C before the save is queued: the bookkeeping names no unsaved folder
            trainer.record_save()  # the log rows so far reach the loggers before they save
            for logger in trainer.loggers:
                logger.save()
            meta = trainer.checkpoint_meta(module)  # holds state_dict() and the options restore errors quote
            if ranked:
                meta["score"] = {"monitor": self.monitor, "value": list(score) if isinstance(score, tuple) else score}
            writer.save(path, self._saved_state(trainer, module, meta), meta, delete=dropped, on_failure=undo)
        except BaseException:
            undo()
            raise
        self._saved_steps.add(step)
        if self._listed is not None:
            self._listed.add(Path(path).name)
        self._last_time = time.monotonic()
        for logger in trainer.loggers:
            logger.after_save_checkpoint(self)
        if self.verbose:
            print(f"ModelCheckpoint: saving {path}")

    def _saved_state(self, trainer, module, meta: dict[str, Any]):
        """The state to save: the whole of it, or with weights="trainable" its trained parameters
        alone (`meta` given the frozen ones' fingerprints, computed at the fit's first save)."""
        mask = module.trainable_mask(trainer.state.params) if self.weights == "trainable" else None
        if mask is None:
            if self.weights == "trainable" and self._frozen is None:
                self._frozen = {}
                warnings.warn("ModelCheckpoint(weights='trainable') saves every parameter: this fit's optimizer "
                              "freezes none (use `module.apply_lora(...)` or `fj.param_groups` with a group None).",
                              stacklevel=_stack.user_stacklevel())
            return trainer.state
        if self._frozen is None:  # the frozen part never changes during a fit: read once
            self._frozen = checkpoint.fingerprints(trainer.state.params, mask)
        meta[checkpoint.FROZEN_KEY] = self._frozen
        return checkpoint.keep_trained(trainer.state, mask)

    def _score(self, trainer) -> tuple[float | tuple[float, ...] | None, bool]:
        """`(score, ranked)`: the monitored value (NaN as +-inf, like Lightning; each run's, a
        tuple, when the runs of a `Trainer(runs=...)` fit log it) and whether this save takes
        part in the top-k ranking."""
        if self.save_top_k == 0:
            return None, False
        if self.monitor is None:
            return None, True
        candidates = self._monitor_candidates(trainer)
        runs = trainer.runs
        if self.monitor not in candidates and runs is not None and self.monitor + run_suffix(0) in candidates:
            return tuple(self._finite(candidates[self.monitor + run_suffix(i)]) for i in range(runs.size)), True
        if self.monitor not in candidates:
            message = (f"ModelCheckpoint(monitor={self.monitor!r}) could not find the monitored key "
                       f"in the logged metrics: {sorted(candidates)}. Log it (e.g. a `val/<name>` from "
                       "`metrics`, or `self.log(...)`), or pass one of these names.")
            if self._validated_at is not None:
                raise ValueError(message)  # Lightning raises once validation has run
            if not self._warned_missing:
                warnings.warn(message, stacklevel=_stack.user_stacklevel())
                self._warned_missing = True
            return None, False
        return self._finite(candidates[self.monitor]), True

    def _finite(self, value: Any) -> float:
        score = float(value)
        return (math.inf if self.mode == "min" else -math.inf) if math.isnan(score) else score

    @staticmethod
    def _monitor_candidates(trainer) -> dict[str, float]:
        return {**trainer.callback_metrics, "epoch": trainer.current_epoch, "step": trainer.global_step}

    def _ranks_in_top_k(self, score: float | tuple[float, ...] | None) -> bool:
        """Lightning's `check_monitor_top_k`: a place free, or better than the k-th best (of any
        run's, with runs)."""
        if self.save_top_k == -1 or self.monitor is None:
            return True
        kept = [v for v in self._kept.values() if v is not None]
        return _ranking.in_top_k(score, kept, self.save_top_k, self.mode)

    def _keep(self, *, newest: str, always: bool) -> set[str]:
        """The paths to keep after saving `newest`: the top k, and the newest when it is the
        last (`save_last`) or an exception's save."""
        paths = list(self._kept)
        if self.save_top_k == -1:
            keep = set(paths)
        elif self.monitor is None:
            keep = set(paths[-self.save_top_k:]) if self.save_top_k else set()
        else:
            keep = _ranking.top_k(self.best_k_models, self.save_top_k, self.mode)
        if self.save_last or always:
            keep.add(newest)
        return keep

    def _update_best(self, candidate: str | None) -> None:
        if self.save_top_k == 0:
            return  # Lightning: no top-k, no best path
        if self.monitor is None:
            if candidate is not None:
                self.best_model_path = candidate
            return
        scored = {p: v for p, v in self._kept.items() if v is not None}
        if scored:  # with runs, the best of every run's best
            self.best_model_path, self.best_model_score = _ranking.best(
                {p: (min if self.mode == "min" else max)(v) if isinstance(v, tuple) else v
                 for p, v in scored.items()}, self.mode)

    def _unique_name(self, trainer) -> str:
        """The formatted name; `-v1`, `-v2`, ... appended while that folder exists (Lightning's
        version counter), so a reused `dirpath` never overwrites or skips a save."""
        name = base = self._format_name(trainer)
        version = 1
        exists = (lambda path: path.name in self._listed) if self._listed is not None else (lambda path: path.exists())
        taken = lambda path: exists(path) or str(path) in self._kept or writer.is_queued(path)
        writer = checkpoint.writer()  # a save queued by another callback is not on disk yet
        while taken(self.dirpath / name):
            name, version = f"{base}-v{version}", version + 1
        return name

    def _format_name(self, trainer) -> str:
        values = self._monitor_candidates(trainer)

        def field(match: re.Match) -> str:
            name, spec = match.group(1), match.group(2) or ""
            value = values.get(name, 0)
            return f"{name}={value:{spec[1:]}}" if spec else f"{name}={value}"

        name = _FIELD.sub(field, self.filename).replace("/", "_")
        if "{step" not in self.filename:
            name = f"{name}-step={trainer.global_step}"
        return name

    # ------------------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        return {"dirpath": str(self.dirpath) if self.dirpath is not None else None,
                "best_model_path": self.best_model_path, "best_model_score": self.best_model_score,
                "last_model_path": self.last_model_path, "current_score": self.current_score,
                "kept": [[path, score] for path, score in self._kept.items()]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores what a checkpoint saved (Lightning's rule): `best_model_path` always; the
        kept checkpoints, the best score and `last_model_path` only when the checkpoint was saved
        into this callback's `dirpath` (checked once it is resolved, at fit start), so a resumed
        run ranks and deletes its own saves, never another run's. Every saved path must lie
        directly in the saved `dirpath` (a checkpoint from someone else's folder cannot make top-k
        delete, or "best" read, anything elsewhere): else `CheckpointDamaged` naming the entry."""
        folder = state.get("dirpath")
        try:
            if folder is not None:
                _safe_names.check_folder(folder, entry="ModelCheckpoint's saved 'dirpath'")
            for key in ("best_model_path", "last_model_path"):
                if state.get(key):
                    _safe_names.check_in_folder(state[key], folder, entry=f"ModelCheckpoint's saved {key!r}")
            for path, _ in state.get("kept", []):
                _safe_names.check_in_folder(path, folder, entry="ModelCheckpoint's saved 'kept'")
        except _safe_names.UnsafeName as error:
            raise checkpoint.CheckpointDamaged(f"the checkpoint being resumed is damaged: {error}.") from None
        self.best_model_path = state.get("best_model_path", "")
        self._restoring = state
        if self.dirpath is not None:
            self._restore_kept()

    def _restore_kept(self) -> None:
        """The saved ranking, if the checkpoint was saved into this callback's `dirpath` (now known)."""
        state, self._restoring = self._restoring, None
        if state is None or str(self.dirpath) != state.get("dirpath"):
            return
        self._resumed = True
        self.best_model_score = state.get("best_model_score")
        self.last_model_path = state.get("last_model_path", "")
        self._kept = {path: tuple(score) if isinstance(score, list) else score  # per run: JSON's lists
                      for path, score in state.get("kept", []) if checkpoint.is_checkpoint(path)}


def _same_class(saved_by: str, module) -> bool:
    """Whether a checkpoint's `module` entry ("pkg.train.Classifier") names `module`'s class;
    a script's classes are `__main__.X` when run and `train.X` when imported: the same class.
    A checkpoint without the entry (an older format) counts as the same."""
    cls = type(module)
    ours = f"{cls.__module__}.{cls.__qualname__}"
    if not saved_by or saved_by == ours:
        return True
    from_main = saved_by.startswith("__main__.") or cls.__module__ == "__main__"
    return from_main and saved_by.rsplit(".", 1)[-1] == cls.__qualname__.rsplit(".", 1)[-1]


def _warn_foreign(which: str, foreign: list[tuple[Path, str]], module) -> None:
    """Warns once that `ckpt_path=which` passed over newer checkpoints of another module."""
    if foreign:
        names = ", ".join(f"{str(path)!r} ({saved_by})" for path, saved_by in foreign[:3])
        more = f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
        warnings.warn(f"ckpt_path={which!r} skipped newer checkpoints saved by another module than "
                      f"{type(module).__qualname__}: {names}{more}; they belong to another run. Pass a "
                      "path to resume one of them, or give each experiment its own logger name or "
                      "version.", stacklevel=_stack.user_stacklevel())
        foreign.clear()


def _saved_time(path: Path) -> float:
    return float(checkpoint.read_meta(path).get("saved_at") or (path / checkpoint.META_ITEM).stat().st_mtime)


def _saved_score(path: Path, monitor: str, mode: str) -> float | None:
    """The score a save recorded (with runs, the best run's)."""
    score = checkpoint.read_meta(path).get("score") or {}
    if score.get("monitor") != monitor:
        return None
    value = score["value"]
    return float((min if mode == "min" else max)(value) if isinstance(value, list) else value)
