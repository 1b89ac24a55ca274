"""The one call of the user's code on the bound model (`forward`), and what every step builds
on it: the values a step logs, the init, eval and predict steps, the trace that checks a
module's outputs.

`forward` is the only place that binds the model, sets the module's mode, collects what
`module.log` records and casts to the precision policy: the train step (`fitjax.step.train`),
the statistics pass (`fitjax.step.running_stats`) and everything here call it. No I/O and no
Python side effects: each function is traced once per input shape and then runs as compiled code.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from fitjax import _logged
from fitjax import metrics as acc_lib
from fitjax import precision as precision_lib
from fitjax.step import context
from fitjax.step._jit_rules import explain_jit_rules
from fitjax.step.module_spec import ModuleSpec
from fitjax.step.token_loss import TokenLoss, real_rows
from fitjax._typing import Batch, PyTree
from fitjax.state import TrainState

__all__ = [
    "Forward",
    "StepNames",
    "WHOLE",
    "check_step_outputs",
    "for_hooks",
    "forward",
    "leading_dim",
    "make_eval_step",
    "make_init_fn",
    "make_predict_step",
    "split_loss",
    "step_values",
    "user_metrics",
]

# the key of `for_hooks`'s dict that holds a step's return that is not a dict (an array): the
# hooks get it as it is instead of the values merged with it
WHOLE = "__returned__"

_EVAL_RNG_SALT = 0x5EED  # eval/predict draw from a fixed key: the same params give the same numbers

# what `forward` may call: the spec's field and the method's name in errors
_TRACED = {"loss": "loss", "predict": "predict_step"}


class Forward(NamedTuple):
    """What one call of the user's code on the bound model gave (`ModelBinding`'s shape):
    `out` is the function's return, or the new params when the call initialised the model;
    `model_state` the model state after it; `logged` what `module.log` recorded during it."""

    out: Any
    model_state: PyTree
    logged: _logged.Logged


def forward(spec: ModuleSpec, fn: str, params: PyTree | None, model_state: PyTree | None, rng: jax.Array,
            batch: Batch, *, train: bool, policy: precision_lib.Precision | None = None,
            returned: list | None = None) -> Forward:
    """`spec.<fn>(bound model, batch)` (`fn`: "loss" or "predict") in train or eval mode.

    `params=None`: the model's variables are created by tracing the function (Linen's init; an
    NNX model gives its own) and returned as `(params, model_state)`; what the function itself
    returned then (which Linen's init drops) is appended to `returned` when given. With `policy`, the params
    and the batch are cast to its compute dtype and a Linen model's outputs come back float32.
    JAX's tracer errors from the user's code are re-raised naming the jit rule it broke.
    """
    user_fn = getattr(spec, fn)
    cast = policy is not None and params is not None
    if cast:
        params, batch = policy.cast_compute(params), policy.cast_compute(batch)
    outputs = policy.float32_outputs() if cast else contextlib.nullcontext()
    with spec.mode(train), outputs, _logged.collecting() as logged, explain_jit_rules(spec.owner, _TRACED[fn]):
        if params is None:
            out, new_state = spec.binding.init(user_fn if returned is None else _recording(user_fn, returned),
                                               rng, batch)
        else:
            out, new_state = spec.binding.apply(user_fn, params, model_state, rng, batch, train=train)
    return Forward(out, new_state, logged)


def _recording(fn: Callable, returned: list) -> Callable:
    def recorded(*args: Any) -> Any:
        returned.append(fn(*args))
        return returned[-1]

    return recorded


def split_loss(out: Any, *, token_loss: bool = False) -> tuple[Any, Any]:
    """`(loss, outputs)` of what `loss` returned; a `TokenLoss` as its mean unless `token_loss`
    (the train step keeps it whole, to weigh micro-batches by their counts)."""
    loss, outputs = out if isinstance(out, tuple) and len(out) == 2 else (out, None)
    if isinstance(loss, TokenLoss) and not token_loss:
        loss = loss.mean
    return loss, outputs


def user_metrics(spec: ModuleSpec, batch: Batch, outputs: Any, logged: _logged.Logged, *, train: bool
                 ) -> dict[str, Any]:
    """`spec.metrics(batch, outputs)`, checked; what it logs joins `logged`, the block of the
    forward call that gave `outputs` (a name logged in both raises)."""
    if isinstance(outputs, (context.Returned, context.GroupLosses)):  # a Lightning-style hook's
        outputs = None
    with spec.mode(train), _logged.collecting(into=logged), explain_jit_rules(spec.owner, "metrics"):
        return _check_metrics(spec.owner, spec.metrics(batch, outputs), spec.defined_at["metrics"])


def for_hooks(outputs: Any, *, train: bool) -> dict[str, Any]:
    """What the batch-end hooks' `outputs` add to the step's values, from the `outputs` half of
    what `loss` returned: a Lightning-style hook's dict without its loss (the values hold it),
    or an evaluation hook's array under `WHOLE` (the hooks get it alone, as Lightning passes
    it; `training_step`'s array is its loss, in the values); `loss`'s own outputs dict as it
    is, anything else under "outputs"."""
    if isinstance(outputs, context.GroupLosses) or outputs is None:
        return {}
    if isinstance(outputs, context.Returned):
        value = outputs.value
        if value is None or (train and not isinstance(value, dict)):
            return {}
        found = {k: v for k, v in value.items() if k != "loss"} if isinstance(value, dict) else {WHOLE: value}
    else:
        found = dict(outputs) if isinstance(outputs, dict) else {"outputs": outputs}
    # only arrays can leave the jitted step: anything else (a string, an object) reads as None
    return jax.tree.map(lambda x: x if hasattr(x, "shape") or isinstance(x, (bool, int, float)) else None, found)


def step_values(spec: ModuleSpec, batch: Batch, outputs: Any, loss: jax.Array | None, logged: _logged.Logged,
                *, train: bool) -> dict[str, jax.Array]:
    """The step's values: the loss, the metrics and everything `module.log` recorded."""
    values = user_metrics(spec, batch, outputs, logged, train=train)
    losses = {} if loss is None else {"loss": loss}  # None: a Lightning eval hook returned nothing
    return {**losses, **values, **logged.values}


def leading_dim(batch: Batch) -> int:
    return jax.tree.leaves(batch)[0].shape[0]


def make_init_fn(spec: ModuleSpec, tx: optax.GradientTransformation, metric_names: tuple[str, ...],
                 *, trace: str = "loss") -> Callable[..., TrainState]:
    """`init(rng, batch, given) -> TrainState`; `given` holds existing variables (None: a Linen
    model is initialised by tracing `spec.<trace>`, the loss by default)."""

    def init(rng: jax.Array, batch: Batch, given: tuple[PyTree, PyTree] | None) -> TrainState:
        init_rng, rng = jax.random.split(rng)
        if given is None:  # what `log` records here is dropped
            params, model_state, _ = forward(spec, trace, None, None, init_rng, batch, train=True)
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


def make_eval_step(spec: ModuleSpec, policy: precision_lib.Precision, stage: str = "val", dataloader_idx: int = 0,
                   *, returns: bool = False):
    """`eval_step(params, model_state, rng, acc, batch, mask, index) -> (acc, values)` for the
    evaluation `stage` ("val" or "test": `context.current_stage()` while traced) of the loader
    `dataloader_idx` (`context.current_dataloader_index()`), computing in `policy`'s dtype;
    `index` is the batch's index in this evaluation (what the user's code sees).

    The loss and metrics are computed per example (`vmap` over the batch) and weighted by
    `mask`, so the padded rows of a last partial batch count for nothing and every real example
    counts exactly once, without compiling a second shape. Rows that are all padding by the
    batch's own marks (`real_rows`: a `TextLoader` batch's filler rows) weigh nothing either. A
    `TokenLoss` weighs each example by its `count`, so the loss accumulated is `Σ sums / Σ
    counts` over every token of the evaluation, as training weighs it, whatever the batch size
    or packing; a scalar loss and the metrics weigh each real row the same (Lightning's
    batch-size weights for `self.log` in validation). `values` are this batch's means under
    the same weights.

    `returns=True`: `(acc, values, returned)`, where `returned` is `{"outputs": for_hooks(...),
    "appends": {attribute: [values]}}`, what the step returned and appended to the module's lists,
    each leaf the batch's rows (a leaf with a row per example: `[batch, ...]`, padding included)
    or, for a leaf of another shape (a scalar), its mean over the real examples.
    """

    def eval_step(params, model_state, rng, acc, batch: Batch, mask: jax.Array, index: jax.Array):
        rng = jax.random.fold_in(rng, _EVAL_RNG_SALT)

        def one(example):
            example = jax.tree.map(lambda x: x[None], example)
            with context.collecting_appends() as appended:
                out, _, logged = forward(spec, "loss", params, model_state, rng, example, train=False, policy=policy)
            loss, outputs = split_loss(out, token_loss=True)
            count = None
            if isinstance(loss, TokenLoss):
                loss, count = loss.mean, jnp.asarray(loss.count, jnp.float32)
            values = step_values(spec, example, outputs, loss, logged, train=False)
            hooks = {"outputs": for_hooks(outputs, train=False), "appends": appended} if returns else None
            return values, count, hooks

        with context.stage(stage), context.batch_index(index), context.dataloader_index(dataloader_idx):
            per_example, counts, returned = jax.vmap(one)(batch)
        rows = mask.astype(jnp.float32) * real_rows(batch)
        weights = {name: rows for name in acc}
        if counts is not None and "loss" in weights:
            weights["loss"] = rows * counts

        def mean(x, weight=rows):
            x = jnp.asarray(x, jnp.float32)
            return (x * weight.reshape(-1, *[1] * (x.ndim - 1))).sum(0) / jnp.maximum(weight.sum(), 1.0)

        values = {name: mean(per_example[name], weights[name]) for name in acc
                  if not isinstance(acc[name], acc_lib.Tracked)}
        acc = acc_lib.add(acc, per_example, weights)
        if not returns:
            return acc, values
        # an example's row (its leading axis of 1) becomes the batch's row; anything else a mean
        rows_out = jax.tree.map(lambda x: x.reshape(x.shape[0], *x.shape[2:]) if x.ndim > 1 and x.shape[1] == 1
                                else mean(x), returned)
        return acc, values, rows_out

    return eval_step


def make_predict_step(spec: ModuleSpec, policy: precision_lib.Precision):
    """`predict_step(params, model_state, rng, batch) -> outputs`: `spec.predict` in eval mode,
    computing in `policy`'s dtype (what `log` records there is dropped)."""

    def predict_step(params, model_state, rng, batch: Batch):
        rng = jax.random.fold_in(rng, _EVAL_RNG_SALT)
        return forward(spec, "predict", params, model_state, rng, batch, train=False, policy=policy).out

    return predict_step


@dataclasses.dataclass(frozen=True)
class StepNames:
    """The names a step's values carry, found by tracing: `("loss", *metrics, *logged)` per mode,
    and the options each `module.log` call gave."""

    train: tuple[str, ...]
    eval: tuple[str, ...]
    log_specs: dict[str, _logged.LogSpec]
    #: the stateful metrics among them: name -> the metric with abstract state (train, eval)
    train_metrics: dict[str, Any] = dataclasses.field(default_factory=dict)
    eval_metrics: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: the model's `(params, model_state)` the trace used, as `jax.ShapeDtypeStruct`s
    variables: Any = None
    #: the module's lists an evaluation hook appends to (`self.validation_step_outputs`)
    eval_appends: tuple[str, ...] = ()

    def slots(self, names: tuple[str, ...], *, train: bool) -> dict[str, Any]:
        """`names` as `fitjax.metrics.zeros` takes them: name -> None (a mean) or the metric."""
        found = self.train_metrics if train else self.eval_metrics
        return {name: found.get(name) for name in names}


def check_step_outputs(spec: ModuleSpec, batch: Batch, given, *, train: bool = True) -> StepNames:
    """Traces (never compiles) init + loss + metrics on `batch`; returns the value names.

    Raises the errors a user needs before a long compilation: a non-scalar loss, metrics that are
    not a dict of per-batch scalars. Eval mode is traced too (`module.log` may record other
    names when `self.training` is False). One abstract trace, no compilation, calling the
    user's function twice: a Linen init's own call of it is the train mode's. `train=False`:
    eval mode only (another stage's or loader's names), on `given` variables, abstract ones
    included (`StepNames.variables`): one call.
    """
    owner = spec.owner
    specs: dict[str, _logged.LogSpec] = {}

    def probe(rng, batch, given):
        calls = {}
        if given is None:  # Linen: the init calls the function in train mode, as the train step would
            returned: list = []
            *given, logged = forward(spec, "loss", None, None, rng, batch, train=True, returned=returned)
            if returned:
                calls[True] = (returned[0], logged)
        probed = {}
        for train in modes:
            if train in calls:
                out, logged = calls[train]
            else:
                with context.collecting_appends() as appended:  # the eval hooks' (the train one's fail)
                    out, logged = forward(spec, "loss", *given, rng, batch, train=train)[::2]
                appends[train] = tuple(appended)
            loss, outputs = split_loss(out)
            no_loss = loss is None and not train  # a Lightning eval hook that returns nothing
            _check_loss(owner, jnp.zeros(()) if no_loss else loss, spec.defined_at["loss"])  # a str cannot leave the trace
            values = user_metrics(spec, batch, outputs, logged, train=train)
            for name, log_spec in logged.specs.items():  # a name logged in both modes keeps its train spec
                specs.setdefault(name, log_spec)
            probed[train] = (loss, values, logged.values)
        return probed, tuple(given)

    modes = (True, False) if train else (False,)
    found: dict[bool, dict[str, Any]] = {True: {}, False: {}}
    appends: dict[bool, tuple[str, ...]] = {True: (), False: ()}
    probed, variables = jax.eval_shape(probe, jax.random.key(0), batch, given)

    def names(train: bool) -> tuple[str, ...]:
        loss, values, logged = probed[train]
        no_loss = loss is None and not train
        for name, value in logged.items():
            if name in values:
                raise ValueError(
                    f"{owner}.log({name!r}, ...) logs a name `metrics` also returns; rename one of them."
                )
            if not acc_lib.is_metric(value):
                _check_scalar(f"{owner}.log({name!r}, value)", value)
        found[train] = {name: v for name, v in {**values, **logged}.items() if acc_lib.is_metric(v)}
        return (*(() if no_loss else ("loss",)), *values, *logged)

    train_names = names(True) if train else ()
    eval_names = names(False)
    return StepNames(train_names, eval_names, specs, found[True], found[False], variables=variables,
                     eval_appends=appends[False])


def _as_array(value: Any) -> Any:
    """Python numbers as the arrays they become when a traced function returns them."""
    return jnp.asarray(value) if isinstance(value, (int, float)) else value


def _check_scalar(what: str, value: Any, where: str = "") -> None:
    value = _as_array(value)
    if not hasattr(value, "shape"):
        raise TypeError(f"{what} must be one scalar array per batch (or a metric, e.g. "
                        f"`fitjax.metrics.F1Score(...).update(preds, target)`), got {type(value).__name__}: "
                        f"{value!r}{where}.")
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
        if isinstance(value, acc_lib.MetricCollection):
            raise TypeError(f"{owner}.metrics()[{name!r}] is a MetricCollection; return its metrics, "
                            f"each under its own name: `{{**collection.update(preds, target)}}`{where}.")
        if acc_lib.is_metric(value):
            values = {**values, name: acc_lib.recorded(value)}  # a declaration: the state its updates gave
            continue
        _check_scalar(f"{owner}.metrics()[{name!r}]", value, where)
    return values
