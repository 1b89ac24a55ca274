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
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import inspect
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp
import optax

from fitjax import _logged
from fitjax import step as step_lib

__all__ = [
    "check",
    "check_log_options",
    "check_techniques",
    "eval_step",
    "explain_jit_rules",
    "is_lightning",
    "loss",
    "predict_fn",
    "resolve_spec",
    "stage",
    "train_step",
]

_HOOKS = ("training_step", "validation_step", "test_step", "predict_step")

_HOOK: contextvars.ContextVar[str | None] = contextvars.ContextVar("fitjax_hook", default=None)
_STAGE: contextvars.ContextVar[str] = contextvars.ContextVar("fitjax_eval_stage", default="val")
_BATCH_IDX: contextvars.ContextVar[Any] = contextvars.ContextVar("fitjax_batch_idx", default=None)


def is_lightning(module: Any) -> bool:
    """Whether `module` is written in Lightning's shape (it defines `training_step`)."""
    return callable(getattr(type(module), "training_step", None))


def _defines(module: Any, name: str) -> bool:
    return callable(getattr(type(module), name, None))


@contextlib.contextmanager
def _setting(var: contextvars.ContextVar, value: Any) -> Iterator[None]:
    token = var.set(value)
    try:
        yield
    finally:
        var.reset(token)


def stage(name: str) -> contextlib.AbstractContextManager[None]:
    """Which evaluation hook a traced eval step calls: "val" (`validation_step`) or "test"."""
    return _setting(_STAGE, name)


def _batch_index(value: Any) -> contextlib.AbstractContextManager[None]:
    return _setting(_BATCH_IDX, value)


def _current_batch_index() -> jax.Array:
    value = _BATCH_IDX.get()
    # Created inside the trace, so it is a tracer too: Python control flow on it fails the same
    # way in every hook instead of silently taking one branch.
    return jnp.zeros((), jnp.int32) if value is None else jnp.asarray(value, jnp.int32)


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

_JIT_RULES = (
    (jax.errors.TracerBoolConversionError,
     "a Python `if`/`while`/`and`/`or`/`assert` on a traced value. The step is compiled once, so a "
     "branch cannot depend on the data; compute both sides and pick with `jnp.where(cond, a, b)`, "
     "use `jax.lax.cond`, or branch on static facts (`self.training`, shapes, hyperparameters)"),
    (jax.errors.TracerArrayConversionError,
     "a traced value converted to a NumPy array (`np.asarray(x)`, `np.mean(x)`, `torch.tensor(x)`). "
     "Inside the step values are abstract tracers, not numbers; use `jax.numpy` (`jnp.mean(x)`)"),
    (jax.errors.TracerIntegerConversionError,
     "`int(x)` or a Python index from a traced value. Index with arrays instead (`x[idx]`, "
     "`jnp.take`, `jax.lax.dynamic_slice`) or keep the integer static"),
    (jax.errors.ConcretizationTypeError,
     "a concrete number asked of a traced value (`.item()`, `float(x)`, `.tolist()`). The step "
     "runs as compiled code with no host round trip; return the array or `self.log(name, x)` it "
     "(fitjax fetches logged values when it logs), and print with `jax.debug.print('{}', x)`"),
)


@contextlib.contextmanager
def explain_jit_rules(owner: str, method: str) -> Iterator[None]:
    """Re-raises JAX's tracer errors from a user method with the jit rule broken and the fix."""
    try:
        yield
    except tuple(kind for kind, _ in _JIT_RULES) as err:
        what = next(text for kind, text in _JIT_RULES if isinstance(err, kind))
        raise TypeError(
            f"{owner}.{method} is traced under jax.jit (once, with abstract values) and does {what}. "
            f"`print(x)` is fine but shows a tracer. JAX's message follows: {type(err).__name__}."
        ) from err


def _model_attribute(module: Any) -> str:
    if "model" in vars(module):
        return "model"
    model = module._get_binding().model
    return next(name for name, value in vars(module).items() if value is model)


@contextlib.contextmanager
def _calling(module: Any, model: Any, hook: str) -> Iterator[None]:
    """Inside the block `module.<model attribute>` is the bound model, and `module.log` uses
    `hook`'s defaults; both are restored however the block ends."""
    name = _model_attribute(module)
    previous = vars(module)[name]
    setattr(module, name, model)
    try:
        with _setting(_HOOK, hook), explain_jit_rules(type(module).__name__, hook):
            yield
    finally:
        setattr(module, name, previous)


def _call_hook(module: Any, hook: str, batch: Any) -> Any:
    method = getattr(module, hook)
    positional = [p for p in inspect.signature(method).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) >= 2:  # (batch, batch_idx[, dataloader_idx=0]); Lightning allows (batch)
        return method(batch, _current_batch_index())
    return method(batch)


@dataclasses.dataclass(frozen=True)
class GroupLosses:
    """`training_step`'s `{param group: loss}` under manual optimization (a pytree)."""

    losses: dict[str, jax.Array]


jax.tree_util.register_dataclass(GroupLosses, data_fields=["losses"], meta_fields=[])


def loss(module: Any, model: Any, batch: Any) -> Any:
    """`LitModule.loss` for a Lightning-style module: `(loss, outputs)`, where `loss` is None for
    an evaluation hook that returns nothing (or is not defined)."""
    owner = type(module).__name__
    if module.training:
        hook = "training_step"
    else:
        hook = {"val": "validation_step", "test": "test_step"}[_STAGE.get()]
        if not _defines(module, hook):
            return None, None
    with _calling(module, model, hook):
        out = _call_hook(module, hook, batch)
    if isinstance(out, dict) and "loss" in out:
        out = out["loss"]
    if hook == "training_step" and not getattr(module, "automatic_optimization", True):
        return _manual_losses(owner, model, out)
    if out is None and hook != "training_step":
        return None, None
    if not hasattr(out, "shape") or out.shape != ():
        raise ValueError(
            f"{owner}.{hook} must return the loss (a scalar array) or a dict with a 'loss' entry, "
            f"got {type(out).__name__}: {out!r}. fitjax differentiates that loss; there is no "
            "`None` return to skip a step under jit (multiply the loss by 0 instead)."
        )
    return out, None


def _manual_losses(owner: str, model: Any, out: Any) -> tuple[jax.Array, GroupLosses]:
    scalars = isinstance(out, dict) and out and all(getattr(v, "shape", None) == () for v in out.values())
    if not scalars:
        raise ValueError(
            f"{owner}.training_step with `automatic_optimization = False` must return a dict "
            f"`{{param group: scalar loss}}`, e.g. `{{'generator': g_loss, 'discriminator': d_loss}}`, "
            f"got {type(out).__name__}: {out!r}. Each group (a top-level key of the model's params) "
            "is updated by the gradient of its own loss."
        )
    return sum(out.values()), GroupLosses(dict(out))


def predict_fn(module: Any) -> Callable[[Any, Any], Any]:
    """The `fn(model, batch)` that `Trainer.predict` traces.

    fitjax's `predict_step(self, model, batch)` and Lightning's `predict_step(self, batch,
    batch_idx)` share a name; the first parameter tells them apart (named `model`: fitjax's).
    A Lightning-style module without its own `predict_step` predicts with `self(inputs)`.
    """
    own = "predict_step" in _overridden(module)
    if own and _first_parameter(module.predict_step) != "model":
        def lightning_predict(model, batch):
            with _calling(module, model, "predict_step"):
                return _call_hook(module, "predict_step", batch)
        return lightning_predict
    if not own and is_lightning(module) and "forward" in _overridden(module):
        def forward_predict(model, batch):
            with _calling(module, model, "forward"):
                return module(batch[0] if isinstance(batch, (tuple, list)) else batch)
        return forward_predict
    return module.predict_step


def _overridden(module: Any) -> set[str]:
    from fitjax.module import LitModule  # a cycle at import time: module.py imports this module

    return {name for name in ("predict_step", "forward", "loss")
            if getattr(type(module), name) is not getattr(LitModule, name)}


def _first_parameter(method: Callable) -> str | None:
    params = list(inspect.signature(method).parameters)
    return params[0] if params else None


def check(module: Any) -> None:
    """Raises when a module mixes the two shapes in a way fitjax cannot follow."""
    if is_lightning(module) and "loss" in _overridden(module):
        raise TypeError(
            f"{type(module).__name__} defines both `loss` and `training_step`. fitjax trains either "
            "`loss(self, model, batch)` (+ `metrics`) or Lightning's `training_step(self, batch, "
            "batch_idx)` (+ `self.log`); keep one of them (rename a helper `loss` to `compute_loss`)."
        )


def check_techniques(module: Any) -> None:
    """Manual optimization has its own step; the Trainer's step techniques do not wrap it yet."""
    if is_lightning(module) and not getattr(module, "automatic_optimization", True):
        raise ValueError(
            f"{type(module).__name__} sets `automatic_optimization = False`, which fitjax trains "
            "with its own per-group step; Trainer(precision=..., accumulate_grad_batches=..., "
            "gradient_clip_val=..., steps_per_execution=...) do not apply to it. Leave them at "
            "their defaults and compose clipping or accumulation into each group's optax "
            "transformation (`optax.chain(optax.clip_by_global_norm(1.0), optax.adam(...))`)."
        )


# --------------------------------------------------------------------------- the step functions

def train_step(module: Any, binding: Any, tx: optax.GradientTransformation) -> Callable:
    """The pure train step: `step.make_train_step`'s, or the per-group one under manual
    optimization; a Lightning hook sees `batch_idx = state.step`."""
    manual = is_lightning(module) and not getattr(module, "automatic_optimization", True)
    inner = _manual_train_step(module, binding, tx) if manual else step_lib.make_train_step(module, binding, tx)

    def train_step(state, batch):
        with _batch_index(state.step):
            return inner(state, batch)

    return train_step


def eval_step(module: Any, binding: Any, stage_name: str) -> Callable:
    """`step.make_eval_step`'s function calling `validation_step` ("val") or `test_step`
    ("test"); `batch_idx` counts the batches of this evaluation."""
    inner = step_lib.make_eval_step(module, binding)

    def eval_step(params, model_state, rng, acc, batch, mask):
        # Every earlier batch was full (only the last may be padded), so examples seen / batch
        # size is the index of this batch.
        seen = next(iter(acc.values()))[1] if acc else jnp.zeros(())
        with stage(stage_name), _batch_index((seen / mask.shape[0]).astype(jnp.int32)):
            return inner(params, model_state, rng, acc, batch, mask)

    return eval_step


def _manual_train_step(module: Any, binding: Any, tx: optax.GradientTransformation) -> Callable:
    """One update of every parameter group by the gradient of its own loss (a GAN's
    generator and discriminator): one forward pass, one backward pass per group."""

    def train_step(state, batch):
        rng = jax.random.fold_in(state.rng, state.step)

        def group_losses(params):
            total, outputs, model_state, logged = step_lib._forward(
                module, binding, params, state.model_state, rng, batch, train=True)
            return outputs.losses, (total, model_state, logged)

        losses, pullback, (total, model_state, logged) = jax.vjp(group_losses, state.params, has_aux=True)
        _check_groups(type(module).__name__, losses, state.params)
        grads = jax.tree.map(jnp.zeros_like, state.params)
        for group in losses:
            seed = {g: jnp.ones_like(v) if g == group else jnp.zeros_like(v) for g, v in losses.items()}
            grads[group] = pullback(seed)[0][group]
        values = step_lib._metrics(module, batch, None, total, logged, train=True)
        return step_lib.apply_update(state, tx, grads, model_state, values, batch), values

    return train_step


def _check_groups(owner: str, losses: dict, params: Any) -> None:
    unknown = sorted(set(losses) - set(params))
    if unknown:
        raise ValueError(
            f"{owner}.training_step returned losses for {unknown}, which are not parameter groups; "
            f"the groups are the top-level keys of the model's params: {sorted(params)}."
        )
