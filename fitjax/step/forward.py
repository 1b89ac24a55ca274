"""The forward pieces every step shares: the user's loss on the bound model and the values it
logs; the init, eval and predict steps; the trace that checks a module's outputs.

No I/O and no Python side effects here: each function is traced once per input shape and then
runs as compiled code. The train step built on these is in `fitjax.step.train`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

from fitjax import _logged
from fitjax import metrics as acc_lib
from fitjax.step import context
from fitjax.step._jit_rules import defined_at, explain_jit_rules
from fitjax.step.model_binding import ModelBinding
from fitjax._typing import Batch, PyTree
from fitjax.state import TrainState

__all__ = [
    "StepNames",
    "check_step_outputs",
    "leading_dim",
    "make_eval_step",
    "make_init_fn",
    "make_predict_step",
    "split_loss",
    "step_values",
]

_EVAL_RNG_SALT = 0x5EED  # eval/predict draw from a fixed key: the same params give the same numbers


def split_loss(out: Any) -> tuple[jax.Array, Any]:
    if isinstance(out, tuple) and len(out) == 2:
        return out
    return out, None


def _forward(module, binding: ModelBinding, params, model_state, rng, batch, *, train: bool):
    """`module.loss` on the bound model: `(loss, outputs, new_model_state, logged)`, where
    `logged` holds what `module.log` recorded during the call."""
    with module._mode(train), _logged.collecting() as logged:
        out, new_state = binding.apply(module.loss, params, model_state, rng, batch, train=train)
    loss, outputs = split_loss(out)
    return loss, outputs, new_state, logged.values


def step_values(module, batch, outputs, loss, logged, *, train: bool) -> dict[str, jax.Array]:
    """The step's values: the loss, `module.metrics` and everything `module.log` recorded."""
    with module._mode(train), _logged.collecting() as more:
        values = dict(module.metrics(batch, outputs) or {})
    losses = {} if loss is None else {"loss": loss}  # None: a Lightning eval hook returned nothing
    return {**losses, **values, **logged, **more.values}


def leading_dim(batch: Batch) -> int:
    return jax.tree.leaves(batch)[0].shape[0]


def make_init_fn(module, binding: ModelBinding, tx: optax.GradientTransformation,
                 metric_names: tuple[str, ...], *, trace: Callable | None = None
                 ) -> Callable[..., TrainState]:
    """`init(rng, batch, given) -> TrainState`; `given` holds existing variables (None: a Linen
    model is initialised by tracing `trace(model, batch)`, `module.loss` by default)."""
    trace = trace or module.loss

    def init(rng: jax.Array, batch: Batch, given: tuple[PyTree, PyTree] | None) -> TrainState:
        init_rng, rng = jax.random.split(rng)
        if given is None:
            with module._mode(True), _logged.collecting():  # what `log` records here is dropped
                params, model_state = binding.init(trace, init_rng, batch)
        else:
            params, model_state = given
        return TrainState(
            step=jnp.zeros((), jnp.int32),
            params=params,
            model_state=model_state,
            opt_state=tx.init(params),
            rng=rng,
            metrics=acc_lib.zeros(metric_names),
        )

    return init


def make_eval_step(module, binding: ModelBinding, stage: str = "val", dataloader_idx: int = 0):
    """`eval_step(params, model_state, rng, acc, batch, mask) -> (acc, values)` for the
    evaluation `stage` ("val" or "test": `context.current_stage()` while traced) of the loader
    `dataloader_idx` (`context.current_dataloader_index()`).

    The loss and metrics are computed per example (`vmap` over the batch) and weighted by
    `mask`, so the padded rows of a last partial batch count for nothing and every real example
    counts exactly once, without compiling a second shape. `values` are this batch's means over
    its real examples (what `on_validation_batch_end` receives as `outputs`; a few scalars that
    stay on the device unless a hook reads them). The batch index the user's code sees counts
    the batches of this evaluation.
    """

    def eval_step(params, model_state, rng, acc, batch: Batch, mask: jax.Array):
        rng = jax.random.fold_in(rng, _EVAL_RNG_SALT)
        # Every earlier batch was full (only the last may be padded), so examples seen / batch
        # size is the index of this batch.
        seen = next(iter(acc.values()))[1] if acc else jnp.zeros(())
        index = (seen / mask.shape[0]).astype(jnp.int32)

        def one(example):
            example = jax.tree.map(lambda x: x[None], example)
            loss, outputs, _, logged = _forward(module, binding, params, model_state, rng, example, train=False)
            return step_values(module, example, outputs, loss, logged, train=False)

        with context.stage(stage), context.batch_index(index), context.dataloader_index(dataloader_idx):
            per_example = jax.vmap(one)(batch)
        weight = mask.astype(jnp.float32)
        real = jnp.maximum(weight.sum(), 1.0)
        values = {name: (jnp.asarray(per_example[name], jnp.float32) * weight).sum() / real for name in acc}
        return acc_lib.add(acc, per_example, mask), values

    return eval_step


def make_predict_step(module, binding: ModelBinding, *, fn: Callable | None = None):
    """`predict_step(params, model_state, rng, batch) -> outputs` in eval mode, calling
    `fn(model, batch)` (default `module.predict_step`)."""
    fn = fn or module.predict_step

    def predict_step(params, model_state, rng, batch: Batch):
        rng = jax.random.fold_in(rng, _EVAL_RNG_SALT)
        with module._mode(False), _logged.collecting():  # what `log` records here is dropped
            out, _ = binding.apply(fn, params, model_state, rng, batch, train=False)
        return out

    return predict_step


@dataclasses.dataclass(frozen=True)
class StepNames:
    """The names a step's values carry, found by tracing: `("loss", *metrics, *logged)` per mode,
    and the options each `module.log` call gave."""

    train: tuple[str, ...]
    eval: tuple[str, ...]
    log_specs: dict[str, _logged.LogSpec]


def check_step_outputs(module, binding: ModelBinding, batch: Batch, given) -> StepNames:
    """Traces (never compiles) init + loss + metrics on `batch`; returns the value names.

    Raises the errors a user needs before a long compilation: a non-scalar loss, metrics that are
    not a dict of per-batch scalars. Eval mode is traced too (`module.log` may record other
    names when `self.training` is False): a second abstract trace, no compilation.
    """
    owner = type(module).__name__
    specs: dict[str, _logged.LogSpec] = {}

    def probe(rng, batch, given, train):
        with module._mode(True), _logged.collecting(), explain_jit_rules(owner, "loss"):
            params, model_state = given if given is not None else binding.init(module.loss, rng, batch)
        with module._mode(train), _logged.collecting() as logged:
            with explain_jit_rules(owner, "loss"):
                out, _ = binding.apply(module.loss, params, model_state, rng, batch, train=train)
            loss, outputs = split_loss(out)
            no_loss = loss is None and not train  # a Lightning eval hook that returns nothing
            _check_loss(owner, jnp.zeros(()) if no_loss else loss, defined_at(module, "loss"))  # a str cannot leave the trace
            with explain_jit_rules(owner, "metrics"):
                values = _check_metrics(owner, module.metrics(batch, outputs), defined_at(module, "metrics"))
        for name, spec in logged.specs.items():  # a name logged in both modes keeps its train spec
            specs.setdefault(name, spec)
        return loss, values, logged.values

    def names(train: bool) -> tuple[str, ...]:
        loss, values, logged = jax.eval_shape(functools.partial(probe, train=train),
                                              jax.random.key(0), batch, given)
        no_loss = loss is None and not train
        for name, value in logged.items():
            if name in values:
                raise ValueError(
                    f"{owner}.log({name!r}, ...) logs a name `metrics` also returns; rename one of them."
                )
            _check_scalar(f"{owner}.log({name!r}, value)", value)
        return (*(() if no_loss else ("loss",)), *values, *logged)

    train_names = names(True)
    eval_names = names(False)
    return StepNames(train_names, eval_names, specs)


def _as_array(value: Any) -> Any:
    """Python numbers as the arrays they become when a traced function returns them."""
    return jnp.asarray(value) if isinstance(value, (int, float)) else value


def _check_scalar(what: str, value: Any, where: str = "") -> None:
    value = _as_array(value)
    if not hasattr(value, "shape"):
        raise TypeError(f"{what} must be one scalar array per batch, got {type(value).__name__}: {value!r}{where}.")
    if value.shape != ():
        raise ValueError(
            f"{what} must be one scalar per batch, got shape {value.shape!r}. "
            f"Reduce it over the batch, e.g. `.mean()`{where}."
        )


def _check_loss(owner: str, loss: Any, where: str = "") -> None:
    loss = _as_array(loss)
    if not hasattr(loss, "shape") or loss.shape != () or not jnp.issubdtype(loss.dtype, jnp.floating):
        got = (f"shape {loss.shape} dtype {loss.dtype}" if hasattr(loss, "shape")
               else f"{type(loss).__name__}: {loss!r}")
        raise ValueError(
            f"{owner}.loss must return a scalar float loss (or `(loss, outputs)`), got {got}. "
            f"Reduce it over the batch, e.g. `.mean()`{where}."
        )


def _check_metrics(owner: str, values: Any, where: str = "") -> dict[str, Any]:
    values = values or {}
    if not isinstance(values, dict):
        raise TypeError(
            f"{owner}.metrics must return a dict of name -> scalar, got {type(values).__name__}: "
            f"{values!r}{where}."
        )
    for name, value in values.items():
        if not isinstance(name, str) or name == "loss":
            raise ValueError(
                f"{owner}.metrics returned the key {name!r}; keys must be strings other than 'loss' "
                f"(the loss is logged for you){where}."
            )
        _check_scalar(f"{owner}.metrics()[{name!r}]", value, where)
    return values
