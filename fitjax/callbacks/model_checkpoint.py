"""`ModelCheckpoint`: Lightning's checkpoint callback on Orbax's asynchronous `CheckpointManager`.

A save costs the step one device-to-host copy of the state; Orbax writes it to disk on a thread
while training goes on, and the next save (or the end of fit) waits for the previous one.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import re
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

from etils import epath

from fitjax import checkpoint
from fitjax._lazy import LazyModule
from fitjax.strategies._distributed import broadcast_str
from fitjax.callbacks._base import Callback, ignores_batch

ocp = LazyModule("orbax.checkpoint")  # imported at the first save, not by `import fitjax`

__all__ = ["ModelCheckpoint"]

_STEP_IN_NAME = re.compile(r"(?:^|-)step=(\d+)(?:-|$)")
_FIELD = re.compile(r"\{([^{}:]+)(:[^{}]*)?\}")


class _TemplateNames:
    """Orbax `NameFormat` for names built from a filename template; the step is read back from
    the `step=<n>` part every name carries."""

    def __init__(self) -> None:
        self.names: dict[int, str] = {}

    def build_name(self, step: int) -> str:
        return self.names[step]

    def find_all(self, base_path: epath.PathLike) -> Iterator[ocp.path.step.Metadata]:
        base = Path(base_path)
        if not base.is_dir():
            return
        for path in base.iterdir():
            match = _STEP_IN_NAME.search(path.name)
            if match and checkpoint.is_checkpoint(path):
                yield ocp.path.step.Metadata(step=int(match.group(1)), path=epath.Path(path))

    def find_step(self, base_path: epath.PathLike, step: int) -> ocp.path.step.Metadata:
        for metadata in self.find_all(base_path):
            if metadata.step == step:
                return metadata
        raise ValueError(f"no checkpoint for step {step} in {str(base_path)!r}")


@dataclasses.dataclass
class _Keep:
    """Orbax preservation policy: the `top_k` best (or newest, without a monitor), plus the newest
    when `save_last`, plus the newest when it has no score (a preemption or exception save)."""

    top_k: int
    mode: str
    monitor: str | None
    save_last: bool

    def should_preserve(self, checkpoints: Sequence[Any], *, context: Any = None) -> list[bool]:
        if not checkpoints:
            return []
        newest = max(c.step for c in checkpoints)

        def score(c):
            return c.metrics.get(self.monitor) if self.monitor and c.metrics else None

        if self.monitor is None:
            ranked = sorted(checkpoints, key=lambda c: -c.step)
        else:
            scored = [c for c in checkpoints if score(c) is not None]
            ranked = sorted(scored, key=lambda c: score(c) if self.mode == "min" else -score(c))
        keep = {c.step for c in (ranked if self.top_k < 0 else ranked[: self.top_k])}
        if self.save_last or all(score(c) is None for c in checkpoints if c.step == newest):
            keep.add(newest)
        return [c.step in keep for c in checkpoints]


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

    After fit: `best_model_path`, `best_model_score`, `last_model_path`.

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
        self.best_model_path = ""
        self.best_model_score: float | None = None
        self.last_model_path = ""
        self._manager: ocp.CheckpointManager | None = None
        self._names = _TemplateNames()
        self._scores: dict[str, float] = {}  # path -> monitored value, of the saves made or found
        self._last_time = time.monotonic()
        self._deferred = False

    @property
    def state_key(self) -> str:
        return f"ModelCheckpoint{{monitor={self.monitor!r}, filename={self.filename!r}}}"

    # ------------------------------------------------------------------------------ where

    def resolve_dirpath(self, trainer) -> Path:
        """The folder, decided on process 0 (a logger's version folder is only predicted on the
        others) and shared with every process, which all write the checkpoint with Orbax."""
        if self.dirpath is None:
            log_dir = trainer.log_dir
            local = checkpoint.local_path(log_dir if log_dir is not None else trainer.default_root_dir) / "checkpoints"
            self.dirpath = Path(broadcast_str(str(local)))
        return self.dirpath

    def search_dirs(self, trainer) -> list[Path]:
        """Where `ckpt_path="last"/"best"` looks: the dirpath, or every logger version's."""
        if self.dirpath is not None:
            return [self.dirpath]
        logger = trainer.logger
        if logger is not None and logger.log_dir is not None:
            runs = checkpoint.local_path(logger.log_dir).parent
            return sorted(runs.glob("*/checkpoints")) if runs.is_dir() else []
        return [checkpoint.local_path(trainer.default_root_dir) / "checkpoints"]

    def find(self, which: str, trainer) -> Path | None:
        """The newest complete checkpoint ("last"), or the best scored one ("best")."""
        if which == "best" and self.best_model_path and checkpoint.is_checkpoint(self.best_model_path):
            return Path(self.best_model_path)
        dirs = self.search_dirs(trainer)
        if which == "best" and self.monitor is not None:
            scored = [(s, p) for d in dirs for p, s in self._read_scores(d).items()]
            if scored:
                return Path((min if self.mode == "min" else max)(scored)[1])
        return checkpoint.latest_checkpoint(dirs)

    def _read_scores(self, directory: Path) -> dict[str, float]:
        scores = {}
        for metadata in self._names.find_all(directory):
            file = Path(metadata.path) / "metrics" / "metrics"
            if file.is_file() and self.monitor:
                value = json.loads(file.read_text()).get(self.monitor)
                if value is not None:
                    scores[str(metadata.path)] = float(value)
        return scores

    # ------------------------------------------------------------------------------ hooks

    def on_fit_start(self, trainer, module) -> None:
        self.resolve_dirpath(trainer)  # here, where every process is: it may be a collective
        self._last_time = time.monotonic()
        self._deferred = False

    @ignores_batch
    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
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
            self._save(trainer, module, epoch_end_done=False)

    def on_validation_end(self, trainer, module) -> None:
        # A validation inside the epoch (val_check_interval) gives the monitor a new value.
        if (self.monitor is not None and trainer.val_check_interval is not None and self.every_n_epochs
                and not trainer.sanity_checking
                and trainer.progress.batches_done != trainer.num_training_batches):
            self._save(trainer, module, epoch_end_done=False)

    def on_train_epoch_end(self, trainer, module) -> None:
        due = self.every_n_epochs and (trainer.current_epoch + 1) % self.every_n_epochs == 0
        if due or self._deferred:
            self._deferred = False
            self._save(trainer, module, epoch_end_done=True)

    def on_exception(self, trainer, module, exception: BaseException) -> None:
        if (trainer.received_sigterm or self.save_on_exception) and trainer.state is not None:
            self._save(trainer, module, epoch_end_done=False, always=True)

    def teardown(self, trainer, module, stage: str) -> None:
        if self._manager is not None:
            self._manager.wait_until_finished()  # the pending save completes before fit returns
            self._manager.close()
            self._manager = None

    # ------------------------------------------------------------------------------ saving

    def _get_manager(self, trainer) -> ocp.CheckpointManager:
        if self._manager is None:
            directory = self.resolve_dirpath(trainer)
            monitor = self.monitor
            options = ocp.CheckpointManagerOptions(
                step_name_format=self._names,
                preservation_policy=_Keep(self.save_top_k, self.mode, monitor, self.save_last),
                best_fn=(lambda m: m[monitor]) if monitor else None,
                best_mode=self.mode,
                enable_async_checkpointing=True,
                create=True,
            )
            self._manager = ocp.CheckpointManager(epath.Path(directory), options=options)
            self._scores.update(self._read_scores(directory))
        return self._manager

    def _save(self, trainer, module, *, epoch_end_done: bool, always: bool = False) -> None:
        score = trainer.callback_metrics.get(self.monitor) if self.monitor else None
        if score is not None and not math.isfinite(score):
            score = None
        if not always and self.save_top_k == 0 and not self.save_last:
            return
        if not always and self.monitor is not None and score is None and not self.save_last:
            return  # nothing to rank it by yet
        manager = self._get_manager(trainer)
        step = trainer.global_step
        if step in manager.all_steps():
            return  # already saved at this step
        self._names.names[step] = self._format_name(trainer)
        for logger in trainer.loggers:
            logger.save()
        meta = trainer.checkpoint_meta(module)  # holds the options quoted by restore errors
        manager.save(
            step,
            args=checkpoint.save_args(trainer.state, meta),
            metrics={self.monitor: float(score)} if score is not None else None,
            force=True,
        )
        path = str(self.dirpath / self._names.names[step])
        self.last_model_path = path
        self._last_time = time.monotonic()
        if score is not None:
            self._scores[path] = float(score)
            best = (min if self.mode == "min" else max)(self._scores.items(), key=lambda kv: kv[1])
            self.best_model_path, self.best_model_score = best
        elif self.monitor is None:
            self.best_model_path = path
        for logger in trainer.loggers:
            logger.after_save_checkpoint(self)
        if self.verbose:
            print(f"ModelCheckpoint: saving {path}")

    def _format_name(self, trainer) -> str:
        values = {**trainer.callback_metrics, "epoch": trainer.current_epoch, "step": trainer.global_step}

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
                "last_model_path": self.last_model_path}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.dirpath is None and state.get("dirpath"):
            self.dirpath = Path(state["dirpath"])
        if self.dirpath is not None and str(self.dirpath) == state.get("dirpath"):
            self.best_model_path = state.get("best_model_path", "")
            self.best_model_score = state.get("best_model_score")
            self.last_model_path = state.get("last_model_path", "")
