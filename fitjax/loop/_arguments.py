"""Lightning's spellings of the stage methods' arguments, resolved to fitjax's.

`fit(model, train_dataloaders=, val_dataloaders=)`, `validate/test/predict(model=, dataloaders=)`,
a `DataModule` passed where the data goes (`fit(model, dm)`), no model after a fit (the fitted
one, from its best checkpoint, as Lightning), and the loaders a `LitModule` defines itself
(`train_dataloader()`, `val_dataloader()`, ...) when no data is passed. Each name has one
meaning: passing a value under both spellings is an error naming both.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import logging
import warnings
from typing import Any

from fitjax import module as module_lib
from fitjax.data import DataModule
from fitjax.loop._checks import check_module

__all__ = ["CheckedArguments", "UnknownArgumentError", "check_names", "either", "fit_arguments", "is_datamodule",
           "lightning_flags", "module_loader", "prepare_module", "stage_arguments", "stage_module"]

log = logging.getLogger("fitjax")


def either(method: str, name: str, value: Any, lightning_name: str, lightning_value: Any) -> Any:
    """The value given under fitjax's `name` or Lightning's `lightning_name` (not both)."""
    if value is not None and lightning_value is not None:
        raise TypeError(
            f"Trainer.{method} got both {name}= and {lightning_name}= (Lightning's name for the "
            f"same argument); pass one of them."
        )
    return value if value is not None else lightning_value


def fit_arguments(module: Any, model: Any, train_data: Any, train_dataloaders: Any, val_data: Any,
                  val_dataloaders: Any, datamodule: Any) -> tuple[Any, Any, Any, Any]:
    """`Trainer.fit`'s `(module, train_data, val_data, datamodule)` from fitjax's or Lightning's
    spellings (a datamodule passed as `train_data`: Lightning's `fit(model, dm)`)."""
    module = either("fit", "module", module, "model", model)
    train_data = either("fit", "train_data", train_data, "train_dataloaders", train_dataloaders)
    val_data = either("fit", "val_data", val_data, "val_dataloaders", val_dataloaders)
    if is_datamodule(train_data) and datamodule is None:
        datamodule, train_data = train_data, None
    if module is None:
        raise TypeError("Trainer.fit needs the module to train: `trainer.fit(module, train_data)` "
                        "(Lightning's `model=` works too).")
    return module, train_data, val_data, datamodule


def is_datamodule(value: Any) -> bool:
    """Whether `value`, passed where data goes, is a datamodule (Lightning's `fit(model, dm)`)."""
    return isinstance(value, DataModule)


def stage_arguments(trainer: Any, method: str, module: Any, model: Any, data: Any, dataloaders: Any,
                    datamodule: Any, ckpt_path: Any) -> tuple[Any, Any, Any, Any]:
    """`validate`/`test`/`predict`'s `(module, data, datamodule, ckpt_path)` from fitjax's or
    Lightning's spellings (`model=`, `dataloaders=`, a datamodule as `data`, no module after a
    fit), the module checked and given the trainer (Lightning's `self.trainer`)."""
    module = either(method, "module", module, "model", model)
    data = either(method, "data", data, "dataloaders", dataloaders)
    if is_datamodule(data) and datamodule is None:
        datamodule, data = data, None
    module, ckpt_path = stage_module(trainer, method, module, ckpt_path)
    check_module(module, method)
    module.trainer = trainer
    return module, data, datamodule, ckpt_path


def stage_module(trainer: Any, method: str, module: Any, ckpt_path: Any) -> tuple[Any, Any]:
    """`(module, ckpt_path)` for `validate`/`test`/`predict`: without a module, the one the
    trainer last ran, from its best checkpoint unless `ckpt_path` says otherwise (Lightning's
    rule, with its warning)."""
    if module is not None:
        return module, ckpt_path
    module = trainer.lightning_module
    if module is None:
        raise TypeError(
            f"Trainer.{method}() needs the module: `trainer.{method}(module, ...)` (Lightning's "
            f"`model=` works too). Without one it uses the module of a previous fit, and this "
            "trainer has run none."
        )
    if ckpt_path is None and trainer.checkpoint_callbacks:
        ckpt_path = "best"
        warnings.warn(
            f"`.{method}(ckpt_path=None)` was called without a model. The best model of the previous "
            f"`fit` call will be used. You can pass `.{method}(ckpt_path='best')` to use the best model "
            f"or `.{method}(ckpt_path='last')` to use the last model. If you pass a value, this warning "
            "will be silenced.", stacklevel=4)
    return module, ckpt_path


def prepare_module(module: Any, stage: str) -> None:
    """Lightning's module data hooks before a stage's loaders are asked for:
    `prepare_data()`, `setup(stage)`, then `configure_model()` (before the model is built)."""
    module.prepare_data()
    module.setup(stage)
    for hook in ("configure_sharded_model", "configure_model"):  # the first is Lightning's old name
        if module_lib.overrides(module, hook):
            getattr(module, hook)()


def module_loader(module: Any, hook: str) -> Any:
    """What the module's own `hook` (`train_dataloader`, `val_dataloader`, ...) returns; None
    when the module does not define it."""
    if not callable(getattr(type(module), hook, None)):
        return None
    return getattr(module, hook)()


# Lightning's Trainer flags that have no JAX meaning: (Lightning's default, what JAX does instead)
_NO_JAX_MEANING = {
    "benchmark": (None, "XLA picks (and on GPU autotunes) its kernels when it compiles each step; "
                        "there is no cuDNN benchmark switch"),
    "inference_mode": (True, "evaluation and predict run jitted functions that compute no gradients; "
                             "there is no autograd mode to switch"),
    "sync_batchnorm": (False, "a jitted step over a batch sharded on the devices normalises over the "
                              "whole global batch already (BatchNorm is synced, whatever the flag)"),
    "use_distributed_sampler": (True, "the strategy splits each batch over the devices; each process "
                                      "loads its own part (`fj.DataLoader` does it); no sampler is replaced"),
}


def lightning_flags(**flags: Any) -> None:
    """Accepts Lightning's flags with no JAX meaning; says, once per flag set to something other
    than Lightning's default, what JAX does instead (the "fitjax" logger, INFO)."""
    for name, value in flags.items():
        default, instead = _NO_JAX_MEANING[name]
        if value is not None and not isinstance(value, bool):
            raise ValueError(f"Trainer({name}=...) must be True or False, got {value!r}")
        if value is not None and value != default:
            log.info(f"Trainer({name}={value!r}) has no effect under JAX: {instead}.")


# --------------------------------------------------------------------- unknown argument names

class UnknownArgumentError(TypeError):
    """An argument name a constructor does not take, with the names it does (a TypeError, so code
    catching Python's own error for it keeps working)."""


# Lightning 1.x and common habits whose fitjax name is not close in spelling
_RENAMED = {"gpus": "devices (with accelerator='gpu')", "tpu_cores": "devices (with accelerator='tpu')",
            "num_processes": "devices", "epochs": "max_epochs", "steps": "max_steps",
            "resume_from_checkpoint": "Trainer.fit(ckpt_path=...)"}


@functools.lru_cache(maxsize=None)
def _names(cls: type) -> tuple[str, ...] | None:
    """The keyword names `cls(...)` takes; None when it takes any (`**kwargs`)."""
    params = inspect.signature(cls.__init__).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return tuple(p.name for p in params if p.name != "self")


def check_names(cls: type, given: dict[str, Any]) -> None:
    """Raises `UnknownArgumentError` for names in `given` that `cls(...)` does not take, saying
    which known name each one probably meant ("did you mean")."""
    names = _names(cls)
    unknown = [name for name in given if names is not None and name not in names]
    if not unknown:
        return
    hints = []
    for name in unknown:
        close = _RENAMED.get(name) or next(iter(difflib.get_close_matches(name, names, n=1, cutoff=0.6)), None)
        hints.append(f"{name}= (did you mean {close}?)" if close else f"{name}=")
    raise UnknownArgumentError(
        f"{cls.__name__}() got unknown argument{'s' if len(unknown) > 1 else ''} {', '.join(hints)}; it "
        f"takes {', '.join(names)}."
    )


class CheckedArguments(type):
    """The Trainer's metaclass: an unknown argument name gets "did you mean" and the valid names (an
    `UnknownArgumentError`, a TypeError) before `__init__` binds them; Python's own error names
    neither. Tools reading the class's arguments (jsonargparse, `inspect`) still see `__init__`'s."""

    def __call__(cls, *args: Any, **kwargs: Any):
        check_names(cls, kwargs)
        return super().__call__(*args, **kwargs)

    @property
    def __signature__(cls) -> inspect.Signature:
        signature = inspect.signature(cls.__init__)
        return signature.replace(parameters=list(signature.parameters.values())[1:])
