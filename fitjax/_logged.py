"""What `LitModule.log` records while the trainer traces `loss` and `metrics`.

`step.py` opens a `collecting()` block around each traced user call; `LitModule.log` adds a
value to the innermost open block. The values are tracers of the step being traced, so they leave
it as extra outputs of the jitted function and are accumulated on device with the other metrics:
no callback, no host transfer. The options (`prog_bar`, `on_step`, ...) are static Python facts,
recorded once per trace and read by the trainer when it logs.

Any code path that traces user code (a Lightning-style `training_step`, say) can reuse this: open
`collecting()` around the call and merge the returned values into the step's metrics.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from typing import Any, Iterator

import numpy as np

from fitjax import metrics as acc_lib

__all__ = ["LogSpec", "Logged", "collecting", "compute", "compute_with_pictures", "for_progress_bar", "host_values",
           "keep", "keyed", "loader_count", "loader_suffix", "numbers", "of_loader", "open_host_block", "plain_names",
           "plain_of", "record"]

REDUCE_FX = ("mean",)


@dataclasses.dataclass(frozen=True)
class LogSpec:
    """How a value passed to `LitModule.log` is shown and logged (static, fixed at trace time)."""

    prog_bar: bool = False
    on_step: bool | None = None  # None: the stage's default (train: window and epoch; eval: epoch)
    on_epoch: bool | None = None
    reduce_fx: str = "mean"
    lightning: bool = False  # logged from a Lightning-style hook: Lightning's keys (see `compute`)


class Logged:
    """The values and specs recorded inside one `collecting()` block, in call order. `host`:
    the block wraps a host-side hook (`on_train_epoch_end`, ...), whose values are logged as
    they are, under the names given (Lightning's keys)."""

    def __init__(self, host: bool = False) -> None:
        self.values: dict[str, Any] = {}
        self.specs: dict[str, LogSpec] = {}
        self.host = host
        # the updates of metric declarations made inside the block (`fitjax.metrics.recording`)
        self.updates: dict[int, Any] = {}


_CURRENT: contextvars.ContextVar[Logged | None] = contextvars.ContextVar("fitjax_logged", default=None)


@contextlib.contextmanager
def collecting(*, host: bool = False, into: Logged | None = None) -> Iterator[Logged]:
    """Collects what `LitModule.log` records inside the block (nested blocks shadow outer ones);
    `into`: adds to that earlier block's values (a name recorded in both raises)."""
    logged = Logged(host) if into is None else into
    token = _CURRENT.set(logged)
    try:
        with acc_lib.recording(logged.updates):
            yield logged
    finally:
        _CURRENT.reset(token)


def open_host_block() -> Logged | None:
    """The innermost open block when it wraps a host hook (its values are logged when it returns;
    `callback_metrics` shows them meanwhile), else None."""
    logged = _CURRENT.get()
    return logged if logged is not None and logged.host else None


def record(owner: str, name: Any, value: Any, spec: LogSpec) -> None:
    """Adds `value` under `name` to the open block; raises when none is open or `name` repeats."""
    if not isinstance(name, str) or not name or name == "loss":
        raise ValueError(
            f"{owner}.log(name=...) must be a non-empty string other than 'loss' (the loss is logged "
            f"for you), got {name!r}."
        )
    metric = acc_lib.is_metric(value) or isinstance(value, acc_lib.MetricCollection)
    if isinstance(value, acc_lib.MetricCollection):
        raise TypeError(f"{owner}.log({name!r}, <MetricCollection>): log a collection with "
                        f"`self.log_dict(collection)`, which logs each of its metrics under its own name.")
    if spec.reduce_fx not in REDUCE_FX and not metric:
        raise ValueError(
            f"{owner}.log({name!r}, reduce_fx=...) must be one of {REDUCE_FX}, got {spec.reduce_fx!r}. "
            "Values are averaged over examples on device; compute other reductions inside `metrics`."
        )
    for option in ("on_step", "on_epoch"):
        if getattr(spec, option) not in (None, True, False):
            raise ValueError(f"{owner}.log({name!r}, {option}=...) must be None or a bool, "
                             f"got {getattr(spec, option)!r}.")
    logged = _CURRENT.get()
    if logged is None:
        raise RuntimeError(
            f"{owner}.log({name!r}, ...) was called outside `loss`, `metrics` and the hooks the "
            "trainer calls (the module's `on_train_epoch_end`, ..., and every callback hook). Log "
            "from one of those: a callback logs with `module.log(name, value)` in its hook."
        )
    if name in logged.values:
        raise ValueError(f"{owner}.log({name!r}, ...) was called twice in one step; use distinct names.")
    if metric and logged.host:
        raise TypeError(
            f"{owner}.log({name!r}, {value!r}) in a host hook: a metric's state lives in the train state, "
            f"so log it where it is updated (`training_step`, `validation_step`, `metrics`); the trainer "
            f"computes it at each log step and epoch end."
        )
    logged.values[name] = acc_lib.recorded(value) if metric else value
    logged.specs[name] = spec


def keep(values: dict[str, Any], specs: dict[str, LogSpec], option: str) -> dict[str, Any]:
    """`values` without the logged names whose `option` ("on_step" or "on_epoch") is False."""
    if not specs:  # nothing logged with options (the loss alone): a copy, no lookup per name
        return dict(values)
    return {k: v for k, v in values.items() if getattr(specs.get(k), option, None) is not False}


def numbers(acc: dict[str, Any]) -> dict[str, float]:
    """The numbers a host accumulator gives: the means, and each metric's value, a vector of them
    as `name/0`, `name/1`, ... (a matrix is left out here: see `compute_with_pictures`)."""
    return _numbers_and_matrices(acc)[0]


def compute_with_pictures(acc: dict[str, Any], specs: dict[str, LogSpec], *, stage: str, epoch: bool
                          ) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """`compute`'s values and the matrices the accumulator's metrics give (a confusion matrix),
    both under their logged keys: each metric computed once for both."""
    values, matrices = _numbers_and_matrices(acc)
    return (keyed(values, specs, stage=stage, epoch=epoch),
            {_key(name, specs, stage=stage, epoch=epoch): value for name, value in matrices.items()})


def _numbers_and_matrices(acc: dict[str, Any]) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    out, matrices = acc_lib.compute(acc), {}
    for name, value in acc_lib.compute_values(acc).items():
        if value.ndim == 0:
            out[name] = float(value)
        elif value.ndim == 1:
            out.update({f"{name}/{i}": float(v) for i, v in enumerate(value)})
        else:
            matrices[name] = value
    return out, matrices


def _key(name: str, specs: dict[str, LogSpec], *, stage: str, epoch: bool) -> str:
    base, _, tail = name.partition("/")  # a vector's `name/i` takes the spec and suffix of `name`
    spec = specs.get(base)
    if spec is not None and spec.lightning:
        key = base + (("_epoch" if epoch else "_step") if spec.on_step and spec.on_epoch else "")
    else:
        key = f"{stage}/{base}" + ("_epoch" if epoch and stage == "train" else "")
    return key + (f"/{tail}" if tail else "")


def compute(acc: dict[str, Any], specs: dict[str, LogSpec], *, stage: str, epoch: bool) -> dict[str, float]:
    """The means and metric values of a host accumulator under their logged keys.

    fitjax's keys are `<stage>/<name>`, with `_epoch` on train epoch means. Names logged from a
    Lightning-style hook keep Lightning's keys: the bare name, or `<name>_step` (train window)
    and `<name>_epoch` (epoch and evaluation means) when logged both on_step and on_epoch.
    """
    return keyed(numbers(acc), specs, stage=stage, epoch=epoch)


def keyed(values: dict[str, float], specs: dict[str, LogSpec], *, stage: str, epoch: bool) -> dict[str, float]:
    """`compute` of an accumulator whose `numbers` are `values`."""
    return {_key(name, specs, stage=stage, epoch=epoch): value for name, value in values.items()}


def for_progress_bar(values: dict[str, float], specs: dict[str, LogSpec]) -> dict[str, float]:
    """The losses and the values logged with `prog_bar=True`: what a progress bar shows."""
    def marked(key: str) -> bool:
        name = key.split("/", 1)[-1]
        spec = specs.get(name) or specs.get(name.rsplit("_", 1)[0])  # Lightning's `<name>_step`
        return name == "loss" or getattr(spec, "prog_bar", False)

    return {k: v for k, v in values.items() if marked(k)}


def plain_names(acc: dict[str, Any], specs: dict[str, LogSpec], *, epoch: bool) -> dict[str, float]:
    """Lightning's plain names in `callback_metrics` for values logged from a Lightning-style
    hook with both `on_step` and `on_epoch`: `name` holds the latest of `name_step` (a train
    window) and `name_epoch` (an epoch or evaluation mean); loggers get the suffixed keys only."""
    return plain_of(numbers(acc), specs)


def plain_of(values: dict[str, float], specs: dict[str, LogSpec]) -> dict[str, float]:
    """`plain_names` of an accumulator whose `numbers` are `values`."""
    return {name: value for name, value in values.items()
            if (spec := specs.get(name.partition("/")[0])) is not None and spec.lightning and spec.on_step
            and spec.on_epoch}


def host_values(logged: Logged, *, owner: str, hook: str) -> dict[str, float]:
    """The values a host-side hook logged, as floats under the names given."""
    out = {}
    for name, value in logged.values.items():
        try:
            out[name] = float(np.asarray(value).reshape(()))
        except (TypeError, ValueError):
            raise ValueError(
                f"{owner}.log({name!r}, value) in {hook} must be one number (a Python float or a "
                f"scalar array), got {value!r}."
            ) from None
    return out


# ------------------------------------------------------------------- several evaluation loaders

_LOADER_MARK = "/dataloader_idx_"


def loader_suffix(dataloader_idx: int) -> str:
    """Lightning's suffix of the keys an evaluation of several loaders logs for one of them."""
    return f"{_LOADER_MARK}{dataloader_idx}"


def loader_count(values: dict[str, Any]) -> int:
    """How many loaders the keys of `values` name (0: none has a loader suffix)."""
    found = [key.rsplit(_LOADER_MARK, 1)[1] for key in values if _LOADER_MARK in key]
    return max((int(i) + 1 for i in found if i.isdigit()), default=0)


def of_loader(values: dict[str, Any], dataloader_idx: int, *, strip: bool = False) -> dict[str, Any]:
    """Lightning's values of one loader: its own keys and those of no loader (logged outside
    the steps), not the other loaders'; `strip`: its keys without the suffix (a results table)."""
    own = loader_suffix(dataloader_idx)
    return {(key.removesuffix(own) if strip else key): value for key, value in values.items()
            if _LOADER_MARK not in key or key.endswith(own)}
