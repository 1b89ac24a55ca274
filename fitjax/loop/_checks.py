"""The Trainer's argument checks: each names the argument, shows what it got and what is allowed.

Kept apart from `trainer.py` so that the loop reads top to bottom without them.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import os
import stat
import tempfile
import warnings
from typing import Any, Sequence

import jax
import numpy as np

from fitjax.strategies import accelerator_devices, check_devices_match
from fitjax.callbacks import Callback, DefaultCheckpoint, GradientAccumulationScheduler, ModelCheckpoint, with_defaults
from fitjax.callbacks.timer import parse_duration, with_timer
from fitjax import checkpoint
from fitjax import module as module_lib
from fitjax.module import LitModule


def fixed_argument(name: str, argument: str | None = None) -> AttributeError:
    """The error setting `trainer.<name>`, a `Trainer(...)` argument's value (`argument` where
    the argument has another name), raises."""
    return AttributeError(f"Trainer.{name} is read-only: it is a `Trainer({argument or name}=...)` argument, fixed "
                          "when the Trainer is made; make another Trainer to change it.")


def loop_sets(name: str) -> AttributeError:
    """The error setting `trainer.<name>`, what the loop sets for callbacks and users to read, raises."""
    return AttributeError(f"Trainer.{name} is read-only: the loop sets it; callbacks and users read it.")


def positive_int_or_none(name: str, value: Any) -> int | None:
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value > 0):
        return value
    raise ValueError(f"Trainer({name}=...) must be a positive int or None, got {value!r}")


def check_limit(name: str, value: Any) -> int | float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or (
        isinstance(value, float) and value > 1.0
    ):
        raise ValueError(
            f"Trainer({name}=...) takes an int number of batches or a float fraction in [0, 1], "
            f"got {value!r}"
        )
    return value


def apply_limit(limit: int | float | None, total: int | None, *, stage: str = "train") -> int | None:
    """The batches `limit_<stage>_batches` keeps of `total` (None: unknown length).

    Lightning's rules: a fraction needs a known length and is rounded down, and a fraction of a
    non-empty loader that keeps no batch is an error naming the smallest one that keeps one."""
    if limit is None:
        return total
    if not isinstance(limit, float):
        return limit if total is None else min(limit, total)
    name = f"limit_{stage}_batches"
    if total is None:
        if limit == 1.0:
            return None
        raise ValueError(f"Trainer({name}={limit!r}): a fraction needs {_STAGE_DATA[stage]} with a known "
                         f"length (len()); pass an int number of batches instead.")
    kept = int(total * limit)
    if kept == 0 and limit > 0 and total > 0:
        raise ValueError(f"Trainer({name}={limit!r}) keeps none of the {total} batches of {_STAGE_DATA[stage]} "
                         f"({limit!r} * {total} < 1); increase it to at least {name}={1.0 / total!r}.")
    return kept


_STAGE_DATA = {"train": "the train data", "val": "the validation data", "test": "the test data",
               "predict": "the predict data"}


def maybe_len(loader) -> int | None:
    try:
        return len(loader)
    except TypeError:
        return None


def select_devices(devices: Any, accelerator: str = "auto") -> list[jax.Device]:
    available = accelerator_devices(accelerator)
    if devices in ("auto", -1, None):
        return available
    if isinstance(devices, int) and not isinstance(devices, bool) and devices > 0:
        if jax.process_count() > 1:  # devices per machine (Lightning's): checked against the environment
            return available
        if devices > len(available):
            raise ValueError(
                f"Trainer(devices={devices}) asks for more devices than the {len(available)} "
                f"available ({available[0].platform}); use devices='auto' or at most {len(available)}."
            )
        return available[:devices]
    if isinstance(devices, Sequence) and devices and all(isinstance(d, jax.Device) for d in devices):
        check_devices_match(accelerator, devices)
        return list(devices)
    raise ValueError(
        f"Trainer(devices=...) takes 'auto', a positive int or a list of jax devices, got {devices!r}"
    )


def accumulation_schedule(callbacks: list[Callback], accumulate_grad_batches: int
                          ) -> GradientAccumulationScheduler | None:
    """The callbacks' `GradientAccumulationScheduler` (one at most), checked against the
    Trainer's own `accumulate_grad_batches` as Lightning checks it."""
    schedulers = [cb for cb in callbacks if isinstance(cb, GradientAccumulationScheduler)]
    if not schedulers:
        return None
    if len(schedulers) > 1:
        raise ValueError(f"Trainer(callbacks=...) holds {len(schedulers)} GradientAccumulationSchedulers; "
                         "pass one, with every epoch's factor in its `scheduling`.")
    if accumulate_grad_batches != 1:
        raise ValueError(
            "You have set `accumulate_grad_batches` and are using the `GradientAccumulationScheduler` "
            f"callback (Trainer(accumulate_grad_batches={accumulate_grad_batches!r})). Either remove "
            "`accumulate_grad_batches` from the Trainer or remove the callback.")
    return schedulers[0]


def trainer_callbacks(callbacks: Any, *, progress_bar: bool, model_summary: bool, checkpointing: bool, max_time: Any,
                      fast_dev_run: int) -> list[Callback]:
    """`Trainer(callbacks=...)` with what its other arguments add: a progress bar, a model
    summary, a `Timer` for `max_time`, the default checkpoint (checkpoint callbacks last); no
    checkpoint callback in a `fast_dev_run` smoke test (it leaves no checkpoints behind)."""
    callbacks = with_defaults(callback_list(callbacks), progress_bar=progress_bar, model_summary=model_summary)
    callbacks = with_checkpointing(with_timer(callbacks, max_time), checkpointing)
    if fast_dev_run:
        callbacks = [cb for cb in callbacks if not isinstance(cb, ModelCheckpoint)]
    return callbacks


def with_checkpointing(callbacks: list[Callback], enabled: bool) -> list[Callback]:
    """Adds the default `ModelCheckpoint` when enabled, and puts checkpoint callbacks last so
    that the states they save include every other callback's update of the same hook."""
    checkpoints = [cb for cb in callbacks if isinstance(cb, ModelCheckpoint)]
    if checkpoints and not enabled:
        raise ValueError(
            "Trainer(enable_checkpointing=False) was given a ModelCheckpoint in callbacks=; drop "
            "one of the two."
        )
    if enabled and not checkpoints:
        checkpoints = [DefaultCheckpoint()]  # saves spaced to cost at most 5% of the fit's time
    keys = [cb.state_key for cb in checkpoints]
    if len(set(keys)) < len(keys):  # Lightning raises too: one callback's saved state would be lost
        twin = next(key for key in keys if keys.count(key) > 1)
        raise ValueError(f"Trainer(callbacks=...) has two ModelCheckpoint with the state key {twin!r}; "
                         "give one of them another filename= (or monitor, mode, every_n_...) so "
                         "that each one's state is saved and resumed.")
    return [cb for cb in callbacks if not isinstance(cb, ModelCheckpoint)] + checkpoints


def check_module(module: Any, method: str = "fit") -> None:
    if not isinstance(module, LitModule):
        raise TypeError(
            f"Trainer.{method}(module=...) expected a fitjax.LitModule, got {type(module).__name__}: "
            f"{module!r}. Subclass `fj.LitModule` and define `loss` and `configure_optimizer`."
        )
    if "training" not in vars(module):
        raise RuntimeError(
            f"{type(module).__name__}.__init__ did not call `super().__init__()`; add it as the first line."
        )
    module_lib.hook_table.check_hooks(module, method, LitModule)  # no hook it defines goes uncalled


_DATAMODULE_METHODS = ("prepare_data", "setup")


def check_datamodule(method: str, value: Any) -> None:
    """`datamodule=` of a stage method: a `fj.DataModule`, or an object with its methods."""
    if not all(callable(getattr(value, name, None)) for name in _DATAMODULE_METHODS):
        raise TypeError(f"Trainer.{method}(datamodule=...) takes a fj.DataModule (prepare_data, setup and the "
                        f"stage's *_dataloader methods), got {type(value).__name__}: {value!r}; pass "
                        f"loaders as the data argument instead.")


def checkpoint_path(method: str, value: Any) -> str:
    """A checkpoint folder path given to `method`: a str or an `os.PathLike`."""
    if not isinstance(value, (str, os.PathLike)) or isinstance(os.fspath(value), bytes):
        raise TypeError(f"Trainer.{method}(filepath=...) takes a checkpoint folder path (a str or os.PathLike; "
                        f"a gs:// or s3:// URL works too), got {type(value).__name__}: {value!r}")
    return os.fspath(value)


def save_target(filepath: Any, weights_only: bool, *, has_state: bool) -> Any:
    """Where `Trainer.save_checkpoint(filepath, weights_only)` saves (a local folder or a store
    URL's path): a new folder, with a train state to save, and the whole of it."""
    filepath = checkpoint_path("save_checkpoint", filepath)
    if weights_only:
        raise ValueError("Trainer.save_checkpoint(weights_only=True) is not supported: a fitjax "
                         "checkpoint holds the whole train state; load weights only with "
                         "`LitModule.load_from_checkpoint(path)`.")
    if not has_state:
        raise RuntimeError(f"Trainer.save_checkpoint({filepath!r}) needs a train state: "
                           "call it during or after Trainer.fit.")
    path = checkpoint.local_path(filepath)
    if path.exists():
        raise FileExistsError(f"Trainer.save_checkpoint: {str(path)!r} exists; pass a new folder name.")
    return path


def limit_or_unlimited(name: str, value: Any, *, unlimited: bool = True) -> int | None:
    """An int >= 0, or None; with `unlimited`, -1 (Lightning's "no limit") is None too."""
    if unlimited and value == -1 and not isinstance(value, bool):
        return None
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
        return value
    allowed = "an int >= 0, -1 (no limit) or None" if unlimited else "an int >= 0 or None"
    raise ValueError(f"Trainer({name}=...) must be {allowed}, got {value!r}")


def sanity_steps(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value >= -1:
        return value
    raise ValueError(
        f"Trainer(num_sanity_val_steps=...) must be an int >= -1 (-1: the whole validation set, 0: "
        f"no sanity check), got {value!r}"
    )


def fast_dev_run(value: Any) -> int:
    if not isinstance(value, (bool, int)) or value < 0:
        raise ValueError(f"Trainer(fast_dev_run=...) takes a bool or an int >= 0 (0 and False: off; True: 1 "
                         f"batch; n: n batches), got {value!r}")
    return int(value)


_SEED_RANGE = (-2**63, 2**63 - 1)  # what `jax.random.key` takes (a 64-bit integer)


def seed(value: Any) -> int:
    low, high = _SEED_RANGE
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ValueError(f"Trainer(seed=...) must be an int from -2**63 to 2**63 - 1 (a 64-bit random "
                         f"key), got {value!r}")
    return value


def flags(**values: Any) -> None:
    """Each `name=value` is a bool: `"no"` or 2 would otherwise read as True."""
    for name, value in values.items():
        if not isinstance(value, bool):
            raise ValueError(f"Trainer({name}=...) must be True or False, got {value!r}")


def callback_list(value: Any) -> list[Any]:
    """`callbacks` as a list: None is none, one `Callback` is a list of it (as Lightning takes)."""
    if value is None:
        return []
    if isinstance(value, Callback):
        return [value]
    if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__iter__"):
        raise TypeError(f"Trainer(callbacks=...) takes a fitjax.Callback or a list of them, got "
                        f"{type(value).__name__}: {value!r}")
    return list(value)


def root_dir(value: Any) -> str:
    """`default_root_dir` as a str path (the working directory for None), checked to be a folder
    fit can write into now rather than at its first log line."""
    if value is None or value == "":
        return os.getcwd()
    if not isinstance(value, (str, os.PathLike)) or isinstance(os.fspath(value), bytes):
        raise TypeError(f"Trainer(default_root_dir=...) takes a folder path (a str or os.PathLike) or None "
                        f"(the working directory), got {type(value).__name__}: {value!r}")
    path = os.path.expanduser(os.fspath(value))
    if "://" not in path:  # an object-store URL is checked by whoever writes there
        problem = _unwritable(path)
        if problem:
            raise ValueError(f"Trainer(default_root_dir={value!r}) is not a folder fit can write into: "
                             f"{problem}. Pass a folder that exists or can be created.")
    return path


def _unwritable(path: str) -> str | None:
    """Why the folder `path` cannot be written into (None: it can). For a missing folder, a probe
    folder is made and removed in the nearest folder that exists: only trying tells a read-only or
    virtual filesystem from a real one. The probe has a name of its own, because the processes of
    one run check the same folder at the same time: none of them creates or removes `path` itself
    (the loggers create it when they first write)."""
    kind = _kind(path)
    if kind == "file":
        return f"{path!r} is a file"
    if kind == "folder":
        return None if os.access(path, os.W_OK | os.X_OK) else f"{path!r} is not writable"
    parent = os.path.dirname(os.path.abspath(path))
    while (kind := _kind(parent)) is None:
        parent = os.path.dirname(parent)
    if kind == "file":
        return f"{parent!r} is a file"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".fitjax-probe-", dir=parent))
    except OSError as err:
        return f"creating it fails ({type(err).__name__}: {err.strerror})"
    return None


def _kind(path: str) -> str | None:
    """"folder", "file", or None where nothing is, from one look (two looks, `exists` then
    `isdir`, can straddle another process removing the folder)."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    return "folder" if stat.S_ISDIR(mode) else "file"


def val_check_interval(value: Any, check_val_every_n_epoch: int | None
                       ) -> int | float | datetime.timedelta | None:
    """The checked `val_check_interval`: an int, a float, None, or (Lightning 2.6's time-based
    form: "DD:HH:MM:SS", a `timedelta` or a dict of its arguments) a positive `timedelta`."""
    if isinstance(value, (str, dict, datetime.timedelta)):
        interval = parse_duration(value, where="Trainer(val_check_interval=...)")
        if interval.total_seconds() <= 0:
            raise ValueError(f"Trainer(val_check_interval={value!r}) must be a positive duration.")
        return interval
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, (int, float))
        or value <= 0 or (isinstance(value, float) and value > 1)
    ):
        raise ValueError(
            "Trainer(val_check_interval=...) takes an int number of train batches, a float "
            "fraction of an epoch in (0, 1] or a duration ('DD:HH:MM:SS', a datetime.timedelta or a "
            f"dict such as {{'minutes': 30}}), got {value!r}"
        )
    if check_val_every_n_epoch is None and isinstance(value, float):
        raise ValueError(
            f"Trainer(val_check_interval={value!r}) must be an int number of train batches when "
            "check_val_every_n_epoch=None (validation is then counted over the whole run); pass an "
            "int, or set check_val_every_n_epoch."
        )
    return value


def warn_short_epoch(trainer, num_batches: int | float | None) -> None:
    """Lightning's warning (its fit loop's `setup_data`) when an epoch has fewer batches than
    `log_every_n_steps`: the logs would show no point inside an epoch."""
    if (trainer.loggers and not trainer.fast_dev_run and num_batches is not None and math.isfinite(num_batches)
            and trainer.log_every_n_steps > num_batches):
        warnings.warn(
            f"The number of training batches ({int(num_batches)}) is smaller than the logging interval "
            f"Trainer(log_every_n_steps={trainer.log_every_n_steps}). Set a lower value for log_every_n_steps "
            "if you want to see logs for the training epoch.", stacklevel=4)


@dataclasses.dataclass(frozen=True)
class BuiltFrom:
    """The batch a model and its steps were built from: its leaves' paths and shapes, to say
    which batch a failing step was given that is shaped otherwise (a feature size, a key).

    Only asked after a step raised: the loop pays nothing per step for it.
    """

    source: str  # e.g. "the first train batch"
    paths: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, batch: Any, source: str) -> "BuiltFrom":
        leaves, _ = jax.tree_util.tree_flatten_with_path(batch)
        return cls(source, tuple(jax.tree_util.keystr(p) for p, _ in leaves),
                   tuple(tuple(np.shape(x)) for _, x in leaves))

    def explain(self, err: Exception, batch: Any, what: str) -> None:
        """Raises a `ValueError` naming `what` (e.g. "the validation data's batch 3") when
        `batch` (stacked micro-batches or steps in front allowed) is shaped unlike the batch the
        model was built from; returns when it is not, for the caller to re-raise `err`."""
        leaves, _ = jax.tree_util.tree_flatten_with_path(batch)
        paths = tuple(jax.tree_util.keystr(p) for p, _ in leaves)
        if paths != self.paths:
            problem = f"its leaves are {list(paths)}, those of {self.source} {list(self.paths)}"
        else:
            problem = next((f"`batch{path}` has shape {_one_batch(np.shape(x), shape)}, in {self.source} {shape}"
                            for path, (_, x), shape in zip(paths, leaves, self.shapes)
                            if not _same_example(np.shape(x), shape)), None)
        if problem is None:
            return
        raise ValueError(
            f"{what} failed in the step and is shaped unlike {self.source}, which the model and "
            f"its steps were built from: {problem}. Give every batch of every stage the same "
            f"feature shapes (only the batch size may differ). The step's error: "
            f"{type(err).__name__}: {err}"
        ) from err


def _same_example(shape: tuple[int, ...], built: tuple[int, ...]) -> bool:
    """Whether a leaf's shape ends with `built`'s per-example dimensions."""
    tail = built[1:]
    return len(shape) >= len(built) and tuple(shape[len(shape) - len(tail):]) == tail


def _one_batch(shape: tuple[int, ...], built: tuple[int, ...]) -> str:
    """`shape` as one batch's: micro-batches or steps stacked in front (accumulation, several
    steps per call) are said apart, so the shape compares with `built`'s."""
    extra = len(shape) - len(built)
    if extra <= 0:
        return str(shape)
    return f"{shape[extra:]} (stacked as {shape})"
