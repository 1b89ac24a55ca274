"""Lightning-style hooks (`training_step`, `validation_step`, `test_step`, `predict_step`,
`forward`) adapted into fitjax's one `loss` / `metrics` path.

A module that defines `training_step` is "Lightning-style". Its default `LitModule.loss` calls
`loss` here, which runs the hook of the stage being traced (`training_step` while
`self.training`, else `validation_step` or `test_step`) with `self.model` pointing at the bound
model, so the hook body reads as in Lightning: `self.model(x)` or `self(x)`. The trainer still
jits one pure step; what differs is only who calls the user's code inside it.

`batch_idx` is a traced int32 inside the jitted step: the global step (optimizer steps taken
before this one) in `training_step`, the index of the batch within the evaluation in
`validation_step` / `test_step`, and 0 in `predict_step`. Python control flow on it
(`if batch_idx == 0:`) fails at the first trace; use `jnp.where` / `jax.lax.cond`.
`dataloader_idx` (several validation or test loaders) is a Python int: the evaluation step of a
hook that takes it is traced once per loader, so `if dataloader_idx == 1:` works as in Lightning.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import inspect
from typing import Any, Callable, Iterator

import jax

from fitjax import _logged
from fitjax.step import context
from fitjax.step import defined_at, explain_jit_rules

__all__ = [
    "check",
    "check_dataloader_idx",
    "check_log_options",
    "explain_jit_rules",
    "is_lightning",
    "is_manual",
    "binding_models",
    "loss",
    "manual_optimization_error",
    "predict_fn",
    "resolve_spec",
    "takes_dataloader_idx",
    "tracing",
]

_HOOKS = ("training_step", "validation_step", "test_step", "predict_step")
_EVAL_STEPS = ("validation_step", "test_step")

_HOOK: contextvars.ContextVar[str | None] = contextvars.ContextVar("fitjax_hook", default=None)


def is_lightning(module: Any) -> bool:
    """Whether `module` is written in Lightning's shape (it defines `training_step`)."""
    return callable(getattr(type(module), "training_step", None))


def is_manual(module: Any) -> bool:
    """Whether `module` optimizes manually: a Lightning-style module with
    `automatic_optimization = False` (its `training_step` returns `{param group: loss}`)."""
    return is_lightning(module) and not getattr(module, "automatic_optimization", True)


def _defines(module: Any, name: str) -> bool:
    return callable(getattr(type(module), name, None))


def resolve_spec(spec: _logged.LogSpec) -> _logged.LogSpec:
    """`spec` with Lightning's defaults filled in when `log` is called from a Lightning hook:
    on_step=True, on_epoch=False in `training_step`; on_step=False, on_epoch=True elsewhere."""
    hook = _HOOK.get()
    if hook is None:
        return spec
    train = hook == "training_step"
    return dataclasses.replace(
        spec,
        on_step=train if spec.on_step is None else spec.on_step,
        on_epoch=(not train) if spec.on_epoch is None else spec.on_epoch,
        lightning=True,
    )


_IGNORED_LOG_OPTIONS = ("logger", "sync_dist", "sync_dist_group", "batch_size", "rank_zero_only",
                        "add_dataloader_idx", "enable_graph", "metric_attribute")


def check_log_options(owner: str, name: str, options: dict) -> None:
    """Accepts Lightning's `self.log` options that have nothing to do under fitjax."""
    unknown = sorted(set(options) - set(_IGNORED_LOG_OPTIONS))
    if unknown:
        raise TypeError(
            f"{owner}.log({name!r}, ...) got unknown options {unknown}; fitjax takes prog_bar, "
            f"on_step, on_epoch, reduce_fx and ignores Lightning's {list(_IGNORED_LOG_OPTIONS)}."
        )


# ----------------------------------------------------------------------- calling the user's hooks

def tracing() -> bool:
    """Whether a Lightning-style hook is being traced into a step right now."""
    return _HOOK.get() is not None


def manual_optimization_error(owner: str, call: str) -> TypeError:
    """The error for Lightning's manual optimization calls, naming fitjax's form."""
    return TypeError(
        f"{owner}.{call}: fitjax has no optimizer objects to step by hand; the whole update is "
        "one jitted step. With `automatic_optimization = False`, `training_step` returns "
        "`{param group: loss}` (e.g. `{'generator': g_loss, 'discriminator': d_loss}`) and each "
        "top-level group of the params is updated by the gradient of its own loss, with the "
        "optimizer `configure_optimizers` gives it (`{group: tx}`); see docs/porting.md, "
        "*Manual optimization*."
    )


@contextlib.contextmanager
def _models_bound(module: Any, model: Any) -> Iterator[None]:
    """Inside the block the module's flax model attributes are the bound models (`self.model`,
    or each of several by its name: `self.net`, `self.target_net`); restored however it ends."""
    names = module._model_attribute_names()
    if not names:
        module._find_model()  # raises, naming what it found
    bound = {names[0]: model} if len(names) == 1 else {name: model[name] for name in names}
    previous = {name: vars(module)[name] for name in names}
    for name, value in bound.items():
        setattr(module, name, value)
    try:
        yield
    finally:
        for name, value in previous.items():
            setattr(module, name, value)


def binding_models(module: Any, fn: Callable) -> Callable:
    """`fn(model, batch)` (fitjax's `loss`) with the module's model attributes bound while it
    runs, for a module with several models (`self.net(x)` inside `loss`); `fn` itself else."""
    if len(module._model_attribute_names()) < 2:
        return fn

    def bound(model: Any, batch: Any) -> Any:
        with _models_bound(module, model):
            return fn(model, batch)

    return bound


@contextlib.contextmanager
def _calling(module: Any, model: Any, hook: str) -> Iterator[None]:
    """Inside the block the module's model attributes are the bound models, and `module.log`
    uses `hook`'s defaults; both are restored however the block ends."""
    lists = {k: len(v) for k, v in vars(module).items() if isinstance(v, list)}
    with _models_bound(module, model), context.setting(_HOOK, hook), \
            explain_jit_rules(type(module).__name__, hook):
        yield
        _check_no_traced_appends(module, hook, lists)


def _check_no_traced_appends(module: Any, hook: str, lengths: dict[str, int]) -> None:
    """Lightning 2.x's `self.validation_step_outputs.append(preds)` keeps a value per batch on
    the module; here the hook runs once, traced. In an evaluation step the appended values are
    taken out of the list and handed to the step (`context.collecting_appends`), which returns
    them per batch for the loop to append, each batch's real rows; anywhere else (the train
    step) it fails at once, naming fitjax's ways (the tracers appended are removed first)."""
    for attr, before in lengths.items():
        items = vars(module).get(attr)
        if not isinstance(items, list) or len(items) <= before:
            continue
        if not any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(items[before:])):
            continue
        appended = items[before:]
        del items[before:]
        collector = context.appends()
        if collector is not None and hook in _EVAL_STEPS:
            collector.setdefault(attr, []).extend(appended)
            continue
        raise TypeError(
            f"{type(module).__name__}.{hook} appended a traced value to `self.{attr}`: the hook runs "
            f"once, when the step is compiled, so the list would hold one placeholder, not a value per "
            f"batch (fitjax appends per batch only in `validation_step` / `test_step`). For a number over "
            f"the epoch use a metric (`fitjax.metrics.F1Score`, `AUROC`, ...: update it here and "
            f"`self.log` it; its state is merged on the device); to see the batch's arrays on the host, "
            f"return them from {hook} (`{{'loss': loss, 'preds': preds}}`) and read them in "
            f"`on_{hook.replace('_step', '').replace('training', 'train')}_batch_end(self, outputs, batch, batch_idx)`."
        )


def _positional(method: Callable) -> list[inspect.Parameter]:
    return [p for p in inspect.signature(method).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def takes_dataloader_idx(method: Callable) -> bool:
    """Lightning's test: a parameter named `dataloader_idx`, or a third positional one."""
    return "dataloader_idx" in inspect.signature(method).parameters or len(_positional(method)) >= 3


def _call_hook(module: Any, hook: str, batch: Any) -> Any:
    method = getattr(module, hook)
    positional = _positional(method)
    if hook in _EVAL_STEPS and takes_dataloader_idx(method):
        # a Python int: `if dataloader_idx == 1:` picks what to log (a step traced per loader)
        return method(batch, context.current_batch_index(), dataloader_idx=context.current_dataloader_index())
    if len(positional) >= 2:  # (batch, batch_idx); Lightning allows (batch)
        return method(batch, context.current_batch_index())
    return method(batch)


def check_dataloader_idx(module: Any, stage: str, *, several: bool) -> None:
    """Lightning's errors, before a step is traced: several loaders need `dataloader_idx` in
    the evaluation hook; one loader needs it to have a default, if the hook takes it."""
    hook = {"val": "validation_step", "test": "test_step"}[stage]
    if not is_lightning(module) or not _defines(module, hook):
        return
    method = getattr(module, hook)
    owner, data = type(module).__name__, {"val": "validation", "test": "test"}[stage]
    if several and not takes_dataloader_idx(method):
        raise RuntimeError(
            f"You passed several {data} loaders, but {owner}.{hook}() has no `dataloader_idx` argument. "
            f"Add `dataloader_idx=0` to its signature: `def {hook}(self, batch, batch_idx, dataloader_idx=0)`."
        )
    param = inspect.signature(method).parameters.get("dataloader_idx")
    if not several and param is not None and param.default is inspect.Parameter.empty:
        raise RuntimeError(
            f"You passed one {data} loader, but {owner}.{hook}() requires `dataloader_idx`. Remove the "
            "argument or give it a default value, i.e. `dataloader_idx=0`."
        )


def loss(module: Any, model: Any, batch: Any) -> Any:
    """`LitModule.loss` for a Lightning-style module: `(loss, context.Returned(what the hook
    returned))`, or `(loss, GroupLosses)` under manual optimization. `loss` is None for an
    evaluation hook that returns no loss: nothing, no hook, or arrays without a scalar "loss"
    (predictions for the batch-end hooks, as Lightning allows)."""
    owner = type(module).__name__
    if module.training:
        hook = "training_step"
    else:
        hook = {"val": "validation_step", "test": "test_step"}[context.current_stage()]
        if not _defines(module, hook):
            return None, None
    with _calling(module, model, hook):
        returned = _call_hook(module, hook, batch)
    out = returned["loss"] if isinstance(returned, dict) and "loss" in returned else returned
    if hook == "training_step" and is_manual(module):
        return _manual_losses(owner, model, out)
    if hook == "training_step" and not _is_scalar(out):
        raise ValueError(
            f"{owner}.{hook} must return the loss (a scalar array) or a dict with a 'loss' entry, "
            f"got {type(out).__name__}: {out!r}{defined_at(module, hook)}. fitjax differentiates that "
            "loss; there is no `None` return to skip a step under jit (multiply the loss by 0 instead)."
        )
    if not all(hasattr(leaf, "shape") or isinstance(leaf, (int, float)) for leaf in jax.tree.leaves(returned)):
        raise ValueError(
            f"{owner}.{hook} must return the loss (a scalar array), a dict of arrays or arrays, "
            f"got {type(out).__name__}: {out!r}{defined_at(module, hook)}. The step is jitted: only "
            "arrays leave it (they reach `on_validation_batch_end(outputs=...)`)."
        )
    return (out if _is_scalar(out) else None), context.Returned(returned)


def _is_scalar(value: Any) -> bool:
    return getattr(value, "shape", None) == ()


def _manual_losses(owner: str, model: Any, out: Any) -> tuple[jax.Array, context.GroupLosses]:
    scalars = isinstance(out, dict) and out and all(getattr(v, "shape", None) == () for v in out.values())
    if not scalars:
        raise ValueError(
            f"{owner}.training_step with `automatic_optimization = False` must return a dict "
            f"`{{param group: scalar loss}}`, e.g. `{{'generator': g_loss, 'discriminator': d_loss}}`, "
            f"got {type(out).__name__}: {out!r}. Each group (a top-level key of the model's params) "
            "is updated by the gradient of its own loss."
        )
    return sum(out.values()), context.GroupLosses(dict(out))


def predict_fn(module: Any, base: type) -> Callable[[Any, Any], Any]:
    """The `fn(model, batch)` that `Trainer.predict` traces.

    fitjax's `predict_step(self, model, batch)` and Lightning's `predict_step(self, batch,
    batch_idx)` share a name; the first parameter tells them apart (named `model`: fitjax's).
    A Lightning-style module without its own `predict_step` predicts with `self(inputs)`.
    """
    own = "predict_step" in _overridden(module, base)
    if own and _first_parameter(module.predict_step) != "model":
        def lightning_predict(model, batch):
            with _calling(module, model, "predict_step"):
                return _call_hook(module, "predict_step", batch)
        return lightning_predict
    if not own and is_lightning(module) and "forward" in _overridden(module, base):
        def forward_predict(model, batch):
            with _calling(module, model, "forward"):
                return module(batch[0] if isinstance(batch, (tuple, list)) else batch)
        return forward_predict
    return module.predict_step


def _overridden(module: Any, base: type) -> set[str]:
    """Which of the methods `base` (`LitModule`, passed in: it imports this module) defines the
    module's class overrides."""
    return {name for name in ("predict_step", "forward", "loss")
            if getattr(type(module), name) is not getattr(base, name)}


def _first_parameter(method: Callable) -> str | None:
    params = list(inspect.signature(method).parameters)
    return params[0] if params else None


def check(module: Any, base: type) -> None:
    """Raises when a module mixes the two shapes in a way fitjax cannot follow."""
    if is_lightning(module) and "loss" in _overridden(module, base):
        raise TypeError(
            f"{type(module).__name__} defines both `loss` and `training_step`. fitjax trains either "
            "`loss(self, model, batch)` (+ `metrics`) or Lightning's `training_step(self, batch, "
            "batch_idx)` (+ `self.log`); keep one of them (rename a helper `loss` to `compute_loss`)."
        )
