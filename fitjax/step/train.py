"""The train step: one gradient function and the options around it.

    for each of `steps_per_execution` optimizer steps (a `lax.scan` when > 1):
        for each of `accumulate_grad_batches` micro-batches (a `lax.scan` when > 1):
            grads += grad(loss(cast(params), cast(micro_batch)) * loss_scale)   # `gradients`
                                                 # w.r.t. the trained part (`trainable`) only
                                                 # (each layer rematerialized with `remat`)
        grads /= k * loss_scale                  # each micro-batch loss divided by k, like Lightning;
                                                 # a TokenLoss: by the step's total token count
        grad_norm = global_norm(grads)           # before clipping (logged with log_grad_norm)
        grads of frozen groups zeroed            # BaseFinetuning (a piece's `group_scales`), if any
        updates = (clip ∘ user optimizer)(grads) # clipping is an optax transform chained first;
                                                 # at the learning rate a piece imposes (SWA), if any
        updates scaled by group, frozen groups keep their optimizer (and model) state
        skip the update if the grads are not finite (16-mixed), adjust the scale
        keep the state the step started from if a piece judges its loss bad (SpikeDetection)
        flag a non-finite loss, grads or params (detect_anomaly)

With `update_in_backward` (`fitjax.step.in_backward`) the gradient and the update of a scanned
layer stack are one pass instead: each layer is updated in the backward pass as its gradient
appears, the rest of the model after; the options that need the whole gradient are refused.

`gradients` is the only place the user's loss is differentiated (`in_backward` differentiates
the same `loss_of`, around the layers). Under manual optimization
(`automatic_optimization = False`) the loss's outputs are `{param group: loss}` and each group
gets the gradient of its own loss; everything around it is the same. An option at its default
adds nothing: the plain step is the same program as before.

The step's inputs are a batch, `(stacked micro-batches [k, ...], mask [k])` with accumulation,
stacked again `[steps, ...]` for several steps per call; or a block of batches already on the
device, `(block [n, batch, ...], base, count)`, from which the step slices its own (`picking`).

Accumulation scans over micro-batches inside one jitted step rather than composing
`optax.MultiSteps`: one dispatch per optimizer step instead of k, no accumulator buffer in the
optimizer state, and the trailing incomplete group of an epoch steps with a mask instead of
waiting for the next epoch (`benchmarks/techniques.py` measures the two).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fitjax import _logged
from fitjax import metrics as acc_lib
from fitjax.strategies import any_on_host, fetched, stored_like
from fitjax.state import TrainState
from fitjax.step import context, in_backward, learning_rate, pieces, trainable as trainable_lib
from fitjax.step.forward import for_hooks, forward, leading_dim, split_loss, step_values
from fitjax.step.module_spec import ModuleSpec
from fitjax.step.options import StepOptions, global_norm
from fitjax.step.model_binding import LinenBinding
from fitjax.step.remat import remat_layers
from fitjax.step.token_loss import split_token_loss

__all__ = ["ANOMALY_KEY", "OUTPUTS_KEY", "check_anomaly", "gradients", "make_train_step", "picking"]

ANOMALY_KEY = "_anomaly"  # step output holding [loss, gradients, parameters] non-finite flags
# step output holding what `loss` / `training_step` returned (`forward.for_hooks`), with
# `StepOptions.hook_outputs`: stacked `[steps][micro-batches]` like the hooks' batch
OUTPUTS_KEY = "_outputs"
_ANOMALY_NAMES = ("loss", "gradients", "parameters")


def _loss_parts(spec: ModuleSpec, policy, remat: str, returns: bool) -> tuple[Callable, Callable]:
    """`(loss_of, values_of)`: the step's loss of `(params, model_state, rng, batch)` ->
    `(loss, count, outputs, new_state, logged)`, and the step's values of `(batch, outputs,
    loss, logged)` (see `gradients`)."""
    owner = spec.owner
    if remat != "none" and not isinstance(spec.binding, LinenBinding):
        raise ValueError(f"Trainer(remat={remat!r}) rematerializes the layers of a flax.linen model; "
                         f"{owner}'s model is a {type(spec.binding).__name__.removesuffix('Binding')} model: "
                         "wrap its layers in `nnx.remat` instead and leave remat='none'.")

    def loss_of(params, model_state, rng, batch):
        with remat_layers(remat):
            out, new_state, logged = forward(spec, "loss", params, model_state, rng, batch, train=True,
                                             policy=policy)
        loss, outputs = split_loss(out, token_loss=True)
        loss, count = split_token_loss(loss)  # a TokenLoss: its sum is differentiated
        # Model state (BatchNorm statistics) keeps its dtype: the donated state's layout must not change.
        new_state = jax.tree.map(lambda new, old: new.astype(old.dtype), new_state, model_state)
        # the updates of metric declarations made in `loss` (`self.f1.update(...)`) leave the
        # differentiated function as their states; the declarations, keys of `metrics`'s
        # `{"f1": self.f1}`, are Python objects kept here (a pytree round trip would copy them)
        declarations.update({key: declared for key, (declared, _) in logged.updates.items()})
        updated = {key: state for key, (_, state) in logged.updates.items()}
        return loss.astype(jnp.float32), count, outputs, new_state, (logged.values, updated)

    declarations: dict[int, Any] = {}

    def values_of(batch, outputs, loss, logged_values):
        """The step's values, `metrics` traced outside the differentiated function."""
        logged_values, updated = logged_values
        logged = _logged.Logged()
        logged.values.update(logged_values)
        logged.updates.update({key: (declarations[key], state) for key, state in updated.items()})
        values = step_values(spec, batch, outputs, loss, logged, train=True)
        return {**values, OUTPUTS_KEY: for_hooks(outputs, train=True)} if returns else values

    return loss_of, values_of


def gradients(spec: ModuleSpec, policy, remat: str = "none",
              trainable: trainable_lib.Trainable | None = None, *, returns: bool = False) -> Callable:
    """`grads(params, model_state, rng, batch, scale) -> (grads, values, new_model_state, count)`.

    `values` are the step's logged values (loss, metrics, `module.log`); `scale` multiplies the
    loss (None: no loss scaling). For a `TokenLoss` the gradient is its sum's, `count` its count
    (the step divides by the counts of all its micro-batches) and the logged loss its mean;
    otherwise `count` is None. Params and floating inputs are cast to the policy's compute
    dtype; the loss and the model state keep float32 / their own dtype. `remat` rematerializes
    each layer's activations (`fitjax.step.remat`). With `trainable`, `params` are its trained
    part (`Trainable.split`) and `grads(params, ..., frozen=...)` takes the frozen part: a
    constant of the loss, differentiated never. `returns`: `values[OUTPUTS_KEY]` holds what
    the user's step returned, for the batch-end hooks (`forward.for_hooks`).
    """
    owner = spec.owner
    merge = (lambda p, frozen: p) if trainable is None else trainable.merge
    loss_of, values_of = _loss_parts(spec, policy, remat, returns)

    def automatic(params, model_state, rng, batch, scale, frozen=None):
        def loss_fn(p):
            loss, count, outputs, new_state, logged = loss_of(merge(p, frozen), model_state, rng, batch)
            return (loss if scale is None else loss * scale), (loss, count, outputs, new_state, logged)

        (_, (loss, count, outputs, new_state, logged)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        mean = loss if count is None else loss / jnp.maximum(count, 1.0)
        return grads, values_of(batch, outputs, mean, logged), new_state, count

    def per_group(params, model_state, rng, batch, scale, frozen=None):
        """One forward pass, one backward pass per group (a GAN's generator and discriminator)."""
        def group_losses(p):
            total, count, outputs, new_state, logged = loss_of(merge(p, frozen), model_state, rng, batch)
            if count is not None:
                raise ValueError(f"{owner} sets `automatic_optimization = False`: its loss is per group "
                                 "(`{param group: loss}`); a TokenLoss is for automatic optimization.")
            if not isinstance(outputs, context.GroupLosses):
                raise ValueError(
                    f"{owner} sets `automatic_optimization = False`: its training step must return "
                    f"`{{param group: loss}}` (a dict of scalars), got outputs {outputs!r}."
                )
            losses = {g: v.astype(jnp.float32) * (1.0 if scale is None else scale)
                      for g, v in outputs.losses.items()}
            return losses, (total, new_state, logged)

        losses, pullback, (total, new_state, logged) = jax.vjp(group_losses, params, has_aux=True)
        _check_groups(owner, losses, params)
        grads = jax.tree.map(jnp.zeros_like, params)
        for group in losses:
            seed = {g: jnp.ones_like(v) if g == group else jnp.zeros_like(v) for g, v in losses.items()}
            grads[group] = pullback(seed)[0][group]
        return grads, values_of(batch, None, total, logged), new_state, None

    return per_group if spec.manual else automatic


def _check_groups(owner: str, losses: dict, params: Any) -> None:
    unknown = sorted(set(losses) - set(params))
    if unknown:
        raise ValueError(
            f"{owner}.training_step returned losses for {unknown}, which are not parameter groups; "
            f"the groups are the top-level keys of the model's params: {sorted(params)}."
        )


def _numbers(values: dict) -> dict:
    """The step's values without the metric states (those are merged into the accumulators)."""
    return {name: value for name, value in values.items() if not acc_lib.is_metric(value)}


def _all_finite(tree: Any) -> jax.Array:
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.asarray(True)


def make_train_step(spec: ModuleSpec, tx: optax.GradientTransformation, options: StepOptions,
                    metric_names: tuple[str, ...], *, single: bool = False,
                    unrolled: bool = False) -> Callable:
    """`train_step(state, inputs) -> (state, values)`: `steps_per_execution` optimizer steps
    (one with `single=True`: an epoch's leftovers); `values` are the last step's.

    `unrolled`: the scans over micro-batches and steps fully unrolled, the same computation as
    one straight program, where a platform runs the loops slowly (`xla_cpu.unrolls_loops`)."""
    policy = options.precision
    k = options.accumulate_grad_batches
    user_names = tuple(n for n in metric_names if n != "grad_norm")
    trainable = trainable_lib.of(tx)  # None: every parameter trains
    grads_of = gradients(spec, policy, options.remat, trainable, returns=options.hook_outputs)
    # `Trainer(update_in_backward=True)`: the gradient and the update as one layer-by-layer pass
    fused_step = _in_backward_step(spec, tx, options, trainable, user_names) if options.update_in_backward else None

    def split(params):
        """(what trains, what is frozen: None when everything trains)."""
        return (params, None) if trainable is None else trainable.split(params)

    def accumulate(state: TrainState, rng, batches, mask, scale):
        """Sum of the micro-batch gradients over `[k, ...]` stacked batches, masked ones skipped."""
        # summed in float32, or in the parameters' dtype when wider ("64-true")
        params, frozen = split(state.params)
        zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.promote_types(p.dtype, jnp.float32)), params)

        def body(carry, xs):
            grads_sum, model_state, acc = carry
            i, batch, keep = xs
            grads, values, new_state, count = grads_of(params, model_state, jax.random.fold_in(rng, i),
                                                       batch, scale, frozen)
            # `where`, not a product: a skipped micro-batch's NaN must not leak into the sum
            grads_sum = jax.tree.map(lambda s, g: s + jnp.where(keep, g.astype(s.dtype), 0.0),
                                     grads_sum, grads)
            model_state = jax.tree.map(lambda n, o: jnp.where(keep, n, o), new_state, model_state)
            weight = keep * leading_dim(batch)
            acc = {**acc, **acc_lib.add({n: acc[n] for n in user_names}, values, weight)}
            tokens = jnp.where(keep, count, 0.0) if count is not None else None
            return (grads_sum, model_state, acc), (_numbers(values), weight, tokens)

        (grads, model_state, acc), (values, weights, tokens) = jax.lax.scan(
            body, (zeros, state.model_state, state.metrics), (jnp.arange(k), batches, mask),
            unroll=k if unrolled else 1)
        returned = values.pop(OUTPUTS_KEY, None)  # each micro-batch's, stacked: not averaged
        total = jnp.maximum(weights.sum(), 1.0)
        means = jax.tree.map(lambda v: (v.astype(jnp.float32) * weights).sum() / total, values)
        if returned is not None:
            means[OUTPUTS_KEY] = returned
        if tokens is not None:  # TokenLoss: the step's loss is Σ sums / Σ counts
            means["loss"] = (values["loss"] * tokens).sum() / jnp.maximum(tokens.sum(), 1.0)
            tokens = tokens.sum()
        return grads, means, model_state, acc, weights.sum(), tokens

    def one_step(state: TrainState, inputs):
        with context.batch_index(state.step):  # a Lightning `training_step` sees the step
            return _one_step(state, inputs)

    def _one_step(state: TrainState, inputs):
        if fused_step is not None:
            return fused_step(state, inputs)
        # `Trainer(offload=...)`: the parameters kept in host memory are fetched for the forward
        # pass; the optimizer state, and the parameters again, only once the gradients exist
        kept = (state.params, state.opt_state)
        offloaded = any_on_host(kept)
        if offloaded:
            state = state.replace(params=fetched(state.params))
        rng = jax.random.fold_in(state.rng, state.step)
        ls = state.loss_scale
        scale = ls.scale if ls is not None else None
        trained, frozen = split(state.params)  # the optimizer sees, and updates, the trained part
        if k > 1:
            batches, mask = inputs
            grads, values, model_state, acc, weight, tokens = accumulate(state, rng, batches, mask, scale)
        else:
            grads, values, model_state, tokens = grads_of(trained, state.model_state, rng, inputs, scale, frozen)
            weight = leading_dim(inputs)
            acc = {**state.metrics, **acc_lib.add({n: state.metrics[n] for n in user_names}, values, weight)}
            values = _numbers(values)  # a metric's state leaves the step only in the accumulators
        # each micro-batch weighs 1/k, as in Lightning; a TokenLoss's tokens weigh the same each
        divisor = float(k) if tokens is None else jnp.maximum(tokens, 1.0)
        divisor = divisor * (1.0 if scale is None else scale)
        if scale is not None or k > 1 or tokens is not None:
            grads = jax.tree.map(lambda g, p: (g / divisor).astype(p.dtype), grads, trained)
        finite = _all_finite(grads) if (ls is not None or options.detect_anomaly) else None

        if options.log_grad_norm:
            values = {**values, "grad_norm": global_norm(grads)}
            acc = {**acc, **acc_lib.add({"grad_norm": acc["grad_norm"]}, values, weight)}
        scaled = pieces.group_scales(options.pieces, state.extras)  # fine-tuning; None: none
        if scaled is not None:  # a frozen group has no gradient (before clipping), as in torch
            grads = pieces.scale_groups(grads, {g: (s != 0).astype(jnp.float32) for g, s in scaled[0].items()})
        if offloaded:
            # the barrier orders the copies after the backward pass: without it XLA starts them at
            # the step's start and the device holds the state beside the activations after all
            # (deviceless v5e compile, 3x2048 MLP, bf16-mixed, batch 16384: peak 350 MB without
            # offload, 419 MB offloaded without the barrier, 370 MB with it; batch 65536: 1324 MB
            # -> 1084 MB). The forward pass's copy of the parameters is dead by then.
            grads, (params_kept, opt_kept) = jax.lax.optimization_barrier((grads, kept))
            state = state.replace(params=fetched(params_kept), opt_state=fetched(opt_kept))
            trained, frozen = split(state.params)
        # `value`: the loss, for optax transforms that read it (optax.contrib.reduce_on_plateau)
        update_fn = optax.with_extra_args_support(tx).update
        imposed = pieces.learning_rate(options.pieces, state.extras)  # SWA's annealing, lr_find; None: none
        if imposed is not None:
            update_fn = functools.partial(learning_rate.update, update_fn, imposed,
                                          schedule=spec.lr_schedule())
        updates, opt_state = update_fn(grads, state.opt_state, trained, value=values["loss"])
        if scaled is not None:  # the group's rate relative to the base rate; frozen: no moments change
            updates = pieces.scale_groups(updates, scaled[0])
            opt_state = pieces.keep_frozen(opt_state, state.opt_state, scaled[0])
            model_state = pieces.keep_frozen(model_state, state.model_state, scaled[1])
        params = optax.apply_updates(trained, updates)
        params = params if trainable is None else trainable.merge(params, frozen)
        if ls is not None:  # skip a non-finite step: keep params and optimizer state
            keep_new = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)  # noqa: E731
            params, opt_state = keep_new(params, state.params), keep_new(opt_state, state.opt_state)
            ls = policy.update_loss_scale(ls, finite)
        if options.detect_anomaly:
            grads_bad = ~finite if state.loss_scale is None else jnp.asarray(False)  # scaling handles it
            values = {**values, ANOMALY_KEY: jnp.stack(
                [~jnp.isfinite(values["loss"]), grads_bad, ~_all_finite(params)])}
        extras = state.extras
        guarded = pieces.guard(options.pieces, extras, values["loss"], state.step)  # SpikeDetection
        if guarded is not None:  # a step judged bad keeps the state it started from
            extras, keep = guarded
            keep_new = lambda new, old: jax.tree.map(lambda n, o: jnp.where(keep, n, o), new, old)  # noqa: E731
            params, opt_state = keep_new(params, state.params), keep_new(opt_state, state.opt_state)
            model_state = keep_new(model_state, state.model_state)
        extras = pieces.update_extras(options.pieces, extras, params, state.step)  # EMA, ...
        if offloaded:  # back where they came from (a scan over steps carries them there)
            params, opt_state = stored_like((params, opt_state), kept)
        new_state = state.replace(step=state.step + 1, params=params, model_state=model_state,
                                  opt_state=opt_state, metrics=acc, loss_scale=ls, extras=extras)
        return new_state, values

    if single or options.steps_per_execution == 1:
        def train_step(state, inputs):  # the name compile logs and counts show
            return one_step(state, inputs)

        return train_step

    def train_step(state, inputs):
        state, values = jax.lax.scan(one_step, state, inputs,
                                     unroll=options.steps_per_execution if unrolled else 1)
        last = {name: v[-1] for name, v in values.items() if name not in (ANOMALY_KEY, OUTPUTS_KEY)}
        if ANOMALY_KEY in values:
            last[ANOMALY_KEY] = values[ANOMALY_KEY]  # [steps, 3]: which step went bad
        if OUTPUTS_KEY in values:
            last[OUTPUTS_KEY] = values[OUTPUTS_KEY]  # every step's, as the hooks' batch holds them
        return state, last

    return train_step


def _in_backward_step(spec: ModuleSpec, tx: optax.GradientTransformation, options: StepOptions,
                      trainable: trainable_lib.Trainable | None, user_names: tuple[str, ...]) -> Callable:
    """`one_step(state, inputs)` with each layer's optimizer update inside the backward pass
    (`Trainer(update_in_backward=True)`, `fitjax.step.in_backward`). The options it cannot
    combine with are refused by `StepOptions.create`; what depends on the module, here."""
    owner = spec.owner
    if spec.manual or trainable is not None:
        what = "sets `automatic_optimization = False`" if spec.manual else "trains only part of its parameters"
        raise ValueError(f"Trainer(update_in_backward=True): {owner} {what}; the layer-by-layer update is for "
                         "automatic optimization of every parameter. Leave update_in_backward=False.")
    loss_of, values_of = _loss_parts(spec, options.precision, options.remat, options.hook_outputs)
    update_fn = optax.with_extra_args_support(tx).update
    fused = in_backward.fused_update(loss_of, tx, update_fn, options.precision.cast_compute, owner)

    def one_step(state: TrainState, inputs):
        for what, found in (("imposes the learning rate (StochasticWeightAveraging, the LR finder)",
                             pieces.learning_rate(options.pieces, state.extras)),
                            ("freezes or scales parameter groups (BaseFinetuning)",
                             pieces.group_scales(options.pieces, state.extras)),
                            ("judges each step before keeping it (SpikeDetection)",
                             pieces.guard(options.pieces, state.extras, jnp.zeros(()), state.step))):
            if found is not None:
                raise ValueError(f"Trainer(update_in_backward=True): a callback {what}, which needs the whole "
                                 "gradient or the state before the update; the layer-by-layer update holds "
                                 "neither. Remove that callback or leave update_in_backward=False.")
        rng = jax.random.fold_in(state.rng, state.step)
        params, opt_state, loss, count, outputs, model_state, logged, grad_norm = fused(
            state.params, state.model_state, rng, inputs, state.opt_state)
        mean = loss if count is None else loss / jnp.maximum(count, 1.0)
        values = values_of(inputs, outputs, mean, logged)
        weight = leading_dim(inputs)
        acc = {**state.metrics, **acc_lib.add({n: state.metrics[n] for n in user_names}, values, weight)}
        values = _numbers(values)
        if options.log_grad_norm:
            values = {**values, "grad_norm": grad_norm}
            acc = {**acc, **acc_lib.add({"grad_norm": acc["grad_norm"]}, values, weight)}
        extras = pieces.update_extras(options.pieces, state.extras, params, state.step)  # EMA, ...
        return state.replace(step=state.step + 1, params=params, model_state=model_state,
                             opt_state=opt_state, metrics=acc, extras=extras), values

    return one_step


def picking(step_fn: Callable, options: StepOptions, *, single: bool = False) -> Callable:
    """`step_fn(state, inputs)` as `train_step(state, (block, base, count))`: the inputs are the
    `batches_per_call` batches of the block (`[n, batch, ...]`, on the device) from row
    `(state.step - base) * accumulate_grad_batches`, shaped as `step_fn` takes them (`single`:
    one optimizer step's). The host sends no batch: only which block, once per block.

    `count` (an int32 scalar) is how many of the call's micro-batches are real: all of them in a
    full call; fewer in an epoch's last accumulation group, whose missing micro-batches (the
    block holds its last one repeated there) are masked as the host path's `group_batches` masks
    them, so that group runs in this same program instead of compiling the host step."""
    k = options.accumulate_grad_batches
    steps = 1 if single else options.steps_per_execution

    def train_step(state, inputs):
        block, base, count = inputs
        first = (state.step - base) * k

        lead = ((steps,) if steps > 1 else ()) + ((k,) if k > 1 else ())

        def pick(a):
            return jax.lax.dynamic_slice_in_dim(a, first, k * steps).reshape(*lead, *a.shape[1:])

        picked = jax.tree.map(pick, block)
        if k > 1:
            picked = (picked, jnp.arange(k * steps).reshape(lead) < count)
        return step_fn(state, picked)

    train_step.__name__ = getattr(step_fn, "__name__", "train_step")
    return train_step


def check_anomaly(outputs: dict, *, global_step: int, epoch: int, num_steps: int) -> dict:
    """Raises `FloatingPointError` naming the step and the first non-finite quantity.

    Reads the flags on the host (a sync per step: `detect_anomaly` is a debugging mode).
    """
    outputs = dict(outputs)
    flags = np.asarray(jax.device_get(outputs.pop(ANOMALY_KEY))).reshape(-1, len(_ANOMALY_NAMES))
    for i, row in enumerate(flags):
        if row.any():
            what = [name for name, bad in zip(_ANOMALY_NAMES, row) if bad]
            step = global_step - num_steps + i
            raise FloatingPointError(
                f"detect_anomaly: non-finite {' and '.join(what)} in optimizer step {step} "
                f"(global_step {step} -> {step + 1}, epoch {epoch}). The first of these is the cause: "
                "check the inputs of that step, lower the learning rate, or clip gradients "
                "(`Trainer(gradient_clip_val=1.0)`)."
            )
    return outputs
