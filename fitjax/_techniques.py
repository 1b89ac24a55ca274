"""Training techniques around the plain step: precision, loss scaling, gradient accumulation and
clipping, several optimizer steps per dispatch, anomaly detection.

`Techniques` holds and checks the Trainer arguments. With all of them at their defaults the
trainer uses `step.make_train_step` unchanged; otherwise `make_train_step` here builds the step:

    for each of `steps_per_execution` optimizer steps (a `lax.scan` when > 1):
        for each of `accumulate_grad_batches` micro-batches (a `lax.scan` when > 1):
            grads += grad(loss(cast(params), cast(micro_batch)) * loss_scale)
        grads /= k * loss_scale                  # each micro-batch loss divided by k, like Lightning
        grad_norm = global_norm(grads)           # before clipping (logged with log_grad_norm)
        updates = (clip ∘ user optimizer)(grads) # clipping is an optax transform chained first
        skip the update if the grads are not finite (16-mixed), adjust the scale

Accumulation scans over micro-batches inside one jitted step rather than composing
`optax.MultiSteps`: one dispatch per optimizer step instead of k, no accumulator buffer in the
optimizer state (it lives only inside the step), and the trailing incomplete group of an epoch can
step with a mask instead of waiting for micro-batches of the next epoch (`benchmarks/techniques.py`
measures the two).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Iterator

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from fitjax import _lightning, _logged
from fitjax import metrics as acc_lib
from fitjax import precision as precision_lib
from fitjax import step as step_lib
from fitjax._typing import Batch, PyTree
from fitjax.state import TrainState

ANOMALY_KEY = "_anomaly"  # step output holding [loss, gradients, parameters] non-finite flags
_ANOMALY_NAMES = ("loss", "gradients", "parameters")
_CLIP_ALGORITHMS = ("norm", "value")


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    raise ValueError(f"Trainer({name}=...) must be a positive int, got {value!r}")


@dataclasses.dataclass(frozen=True)
class Techniques:
    """The step-shaping Trainer arguments, checked once when the Trainer is built."""

    precision: precision_lib.Precision = precision_lib.Precision()
    accumulate_grad_batches: int = 1
    gradient_clip_val: float | None = None
    gradient_clip_algorithm: str = "norm"
    steps_per_execution: int = 1
    detect_anomaly: bool = False
    log_grad_norm: bool = False

    @classmethod
    def create(cls, *, precision, accumulate_grad_batches, gradient_clip_val, gradient_clip_algorithm,
               steps_per_execution, detect_anomaly, log_grad_norm) -> "Techniques":
        if gradient_clip_val is not None and (
            isinstance(gradient_clip_val, bool) or not isinstance(gradient_clip_val, (int, float))
            or not gradient_clip_val > 0
        ):
            raise ValueError(
                f"Trainer(gradient_clip_val=...) must be a positive number or None, got {gradient_clip_val!r}"
            )
        if gradient_clip_algorithm not in _CLIP_ALGORITHMS:
            raise ValueError(
                f"Trainer(gradient_clip_algorithm=...) got {gradient_clip_algorithm!r}; use one of "
                f"{list(_CLIP_ALGORITHMS)}."
            )
        return cls(
            precision=precision_lib.resolve(precision),
            accumulate_grad_batches=_positive_int("accumulate_grad_batches", accumulate_grad_batches),
            gradient_clip_val=None if gradient_clip_val is None else float(gradient_clip_val),
            gradient_clip_algorithm=gradient_clip_algorithm,
            steps_per_execution=_positive_int("steps_per_execution", steps_per_execution),
            detect_anomaly=bool(detect_anomaly),
            log_grad_norm=bool(log_grad_norm),
        )

    @property
    def is_plain(self) -> bool:
        """True when the plain `step.make_train_step` does the job (every option at its default)."""
        return self == Techniques()

    @property
    def grouped(self) -> bool:
        """True when the step takes stacked batches (accumulation or several steps per dispatch)."""
        return self.accumulate_grad_batches > 1 or self.steps_per_execution > 1

    def train_metric_names(self, names: tuple[str, ...]) -> tuple[str, ...]:
        return (*names, "grad_norm") if self.log_grad_norm else names

    def wrap_optimizer(self, tx: optax.GradientTransformation) -> optax.GradientTransformation:
        """Clipping chained before the user's optimizer (it sees the accumulated, unscaled grads)."""
        if self.gradient_clip_val is None:
            return tx
        if self.gradient_clip_algorithm == "norm":
            clip = optax.clip_by_global_norm(self.gradient_clip_val)
        else:
            clip = optax.clip(self.gradient_clip_val)
        return optax.chain(clip, tx)

    def wrap_init(self, init_fn: Callable[..., TrainState], tx: optax.GradientTransformation) -> Callable:
        """Parameters in their storage dtype (and the optimizer state built on them); the loss scale."""
        policy = self.precision
        if policy.is_default:
            return init_fn

        def init(rng, batch, given):
            state = init_fn(rng, batch, given)
            params = policy.cast_params(state.params)
            opt_state = tx.init(params) if policy.param_dtype != jnp.float32 else state.opt_state
            return state.replace(params=params, opt_state=opt_state, loss_scale=policy.initial_loss_scale())

        return init

    def wrap_eval(self, fn: Callable, *, batch_arg: int) -> Callable:
        """An eval/predict step `(params, ...)` computing in the low dtype (params and the batch at
        position `batch_arg` cast)."""
        policy = self.precision
        if policy.compute_dtype == jnp.float32:
            return fn

        def wrapped(params, *rest):
            rest = list(rest)
            rest[batch_arg - 1] = policy.cast_compute(rest[batch_arg - 1])
            with policy.float32_outputs():
                return fn(policy.cast_compute(params), *rest)

        wrapped.__name__ = fn.__name__  # keeps jit's name (compile counts key on it)
        return wrapped

    # ------------------------------------------------------------------------ grouped inputs

    def stacked_sharding(self, batch_sharding: NamedSharding, leading: int) -> NamedSharding:
        """`batch_sharding` with `leading` unsharded dimensions in front (steps, micro-batches)."""
        return NamedSharding(batch_sharding.mesh, P(*([None] * leading), *batch_sharding.spec))

    def chunks(self, batches: Iterable[Batch], *, steps_left: int | None) -> Iterator["Chunk"]:
        """Host batches grouped into what one call of the step consumes (see `Chunk`)."""
        return _chunks(batches, self.accumulate_grad_batches, self.steps_per_execution, steps_left)


# -------------------------------------------------------------------------------- the step

def _forward(module, binding, policy, params, model_state, rng, batch):
    """`step._forward` under the precision policy: `(loss, outputs, new_state, logged)`."""
    with module._mode(True), policy.float32_outputs(), _logged.collecting() as logged:
        out, new_state = binding.apply(module.loss, policy.cast_compute(params),
                                       model_state, rng, policy.cast_compute(batch), train=True)
    loss, outputs = step_lib._split_loss(out)
    # Model state (BatchNorm statistics) keeps its dtype: the donated state's layout must not change.
    new_state = jax.tree.map(lambda new, old: new.astype(old.dtype), new_state, model_state)
    return loss.astype(jnp.float32), outputs, new_state, logged.values


def _all_finite(tree: PyTree) -> jax.Array:
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.asarray(True)


def make_train_step(module, binding, tx: optax.GradientTransformation, tech: Techniques,
                    metric_names: tuple[str, ...], *, single: bool = False) -> Callable:
    """`train_step(state, inputs) -> (state, outputs)`; `inputs` is a batch, or `(stacked, mask)`
    with accumulation, stacked again over `steps_per_execution` (see `Chunk`). `outputs` are the
    last optimizer step's metrics. `single=True`: one optimizer step per call (the leftovers)."""
    policy = tech.precision
    k = tech.accumulate_grad_batches
    user_names = tuple(n for n in metric_names if n != "grad_norm")

    def micro_grads(params, model_state, rng, batch, scale):
        def loss_fn(p):
            loss, outputs, new_state, logged = _forward(module, binding, policy, p, model_state, rng, batch)
            scaled = loss * scale if scale is not None else loss
            return scaled, (loss, outputs, new_state, logged)

        (_, (loss, outputs, new_state, logged)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        values = step_lib._metrics(module, batch, outputs, loss, logged, train=True)
        return grads, values, new_state

    def accumulate(state: TrainState, rng, batches, mask, scale):
        """Sum of the micro-batch gradients over `[k, ...]` stacked batches, masked ones skipped."""
        zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), state.params)

        def body(carry, xs):
            grads_sum, model_state, acc = carry
            i, batch, keep = xs
            grads, values, new_state = micro_grads(state.params, model_state, jax.random.fold_in(rng, i),
                                                   batch, scale)
            # `where`, not a product: a skipped micro-batch's NaN must not leak into the sum
            grads_sum = jax.tree.map(lambda s, g: s + jnp.where(keep, g.astype(jnp.float32), 0.0),
                                     grads_sum, grads)
            model_state = jax.tree.map(lambda n, o: jnp.where(keep, n, o), new_state, model_state)
            weight = keep * step_lib._leading_dim(batch)
            acc = {**acc, **acc_lib.add({n: acc[n] for n in user_names}, values, weight)}
            return (grads_sum, model_state, acc), (values, weight)

        (grads, model_state, acc), (values, weights) = jax.lax.scan(
            body, (zeros, state.model_state, state.metrics), (jnp.arange(k), batches, mask)
        )
        total = jnp.maximum(weights.sum(), 1.0)
        means = jax.tree.map(lambda v: (v.astype(jnp.float32) * weights).sum() / total, values)
        return grads, means, model_state, acc, weights.sum()

    def one_step(state: TrainState, inputs):
        with _lightning._batch_index(state.step):  # a Lightning `training_step` sees the step
            return _one_step(state, inputs)

    def _one_step(state: TrainState, inputs):
        rng = jax.random.fold_in(state.rng, state.step)
        ls = state.loss_scale
        scale = ls.scale if ls is not None else None
        if k > 1:
            batches, mask = inputs
            grads, values, model_state, acc, weight = accumulate(state, rng, batches, mask, scale)
            divisor = float(k)
        else:
            grads, values, model_state = micro_grads(state.params, state.model_state, rng, inputs, scale)
            weight = step_lib._leading_dim(inputs)
            acc = {**state.metrics,
                   **acc_lib.add({n: state.metrics[n] for n in user_names}, values, weight)}
            divisor = 1.0
        if scale is not None:
            divisor = divisor * scale
        if scale is not None or k > 1:
            grads = jax.tree.map(lambda g, p: (g / divisor).astype(p.dtype), grads, state.params)
        finite = _all_finite(grads) if (ls is not None or tech.detect_anomaly) else None

        if tech.log_grad_norm:
            values = {**values, "grad_norm": optax.tree.norm(grads)}
            acc = {**acc, **acc_lib.add({"grad_norm": acc["grad_norm"]}, values, weight)}
        # `value`: the loss, for optax transforms that read it (optax.contrib.reduce_on_plateau)
        updates, opt_state = optax.with_extra_args_support(tx).update(
            grads, state.opt_state, state.params, value=values["loss"])
        params = optax.apply_updates(state.params, updates)
        if ls is not None:  # skip a non-finite step: keep params and optimizer state
            keep_new = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
            params, opt_state = keep_new(params, state.params), keep_new(opt_state, state.opt_state)
            ls = policy.update_loss_scale(ls, finite)
        if tech.detect_anomaly:
            grads_bad = ~finite if state.loss_scale is None else jnp.asarray(False)  # scaling handles it
            values = {**values, ANOMALY_KEY: jnp.stack(
                [~jnp.isfinite(values["loss"]), grads_bad, ~_all_finite(params)])}
        new_state = state.replace(step=state.step + 1, params=params, model_state=model_state,
                                  opt_state=opt_state, metrics=acc, loss_scale=ls)
        return new_state, values

    if single or tech.steps_per_execution == 1:
        def train_step(state, inputs):
            return one_step(state, inputs)
    else:
        def train_step(state, inputs):
            state, values = jax.lax.scan(one_step, state, inputs)
            last = {name: v[-1] for name, v in values.items() if name != ANOMALY_KEY}
            if ANOMALY_KEY in values:
                last[ANOMALY_KEY] = values[ANOMALY_KEY]  # [steps, 3]: which step went bad
            return state, last

    return train_step


def jit_train_steps(module, binding, tx, tech: Techniques, metric_names, strategy, shardings):
    """`(train_step, tail_step, shard_inputs)` jitted with the strategy's shardings.

    Stacked dimensions (steps, micro-batches) are unsharded; the batch dimension keeps the
    strategy's layout, the micro-batch mask is replicated.
    """
    k, spe = tech.accumulate_grad_batches, tech.steps_per_execution
    replicated = strategy.replicated

    def input_shardings(leading: int):
        if k > 1:
            return tech.stacked_sharding(strategy.batch_sharding, leading + 1), replicated
        return tech.stacked_sharding(strategy.batch_sharding, leading)

    def jit(single: bool):
        return strategy.jit(
            make_train_step(module, binding, tx, tech, metric_names, single=single),
            in_shardings=(shardings, input_shardings(0 if single else 1)),
            out_shardings=(shardings, replicated),
            donate_argnums=(0,),
        )

    full_leading = 1 if spe > 1 else 0

    def shard_inputs(inputs, full: bool):
        target = input_shardings(full_leading if full else 0)
        if k > 1:
            return _put(inputs[0], target[0]), _put(inputs[1], target[1])
        return _put(inputs, target)

    if spe == 1:
        return jit(single=True), None, shard_inputs
    return jit(single=False), jit(single=True), shard_inputs


def _put(tree, sharding):
    if jax.process_count() == 1:  # host arrays: the jitted step's in_shardings place them
        return tree
    return jax.tree.map(lambda x: jax.make_array_from_process_local_data(sharding, x), tree)


# ---------------------------------------------------------------------------- host grouping

@dataclasses.dataclass
class Chunk:
    """What one call of the step consumes.

    `inputs` is the batch itself (plain), `(batches [k, ...], mask [k])` with accumulation, with
    an extra leading `[steps]` dimension when several steps run per dispatch (`full`). A chunk
    that is not `full` is run by the single-step function (leftovers of an epoch or `max_steps`).
    An `on_device` chunk's inputs are `(block, base)`, a block of batches already on the devices
    (see `fitjax._resident`).
    """

    inputs: Any
    num_batches: int
    num_steps: int
    full: bool
    #: the batch's row numbers when `inputs` is a block on the devices (`fitjax._resident`)
    rows: Any = None
    on_device: bool = False


def _shape_of(batch: Batch):
    return tuple((x.shape, str(x.dtype)) for x in jax.tree.leaves(batch))


def _groups(batches: Iterable[Batch], k: int) -> Iterator[tuple[Any, int]]:
    """Accumulation groups `((stacked, mask), n_real)`; the last of an epoch may hold fewer than
    k real micro-batches (padded by repeating its last one under a zero mask). A batch of another
    shape (a short last batch) closes the group and starts its own."""
    if k == 1:
        for batch in batches:
            yield batch, 1
        return
    group: list = []

    def emit():
        n = len(group)
        padded = group + [group[-1]] * (k - n)
        stacked = jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *padded)
        mask = np.arange(k) < n
        return (stacked, mask), n

    for batch in batches:
        if group and _shape_of(batch) != _shape_of(group[0]):
            yield emit()
            group = []
        group.append(batch)
        if len(group) == k:
            yield emit()
            group = []
    if group:
        yield emit()


def _chunks(batches, k: int, spe: int, steps_left: int | None) -> Iterator[Chunk]:
    buffer: list[tuple[Any, int]] = []
    for item in _groups(batches, k):
        if steps_left is not None and steps_left <= 0:
            return
        if spe == 1:
            yield Chunk(item[0], item[1], 1, full=True)
            steps_left = None if steps_left is None else steps_left - 1
            continue
        if buffer and _shape_of(item[0]) != _shape_of(buffer[0][0]):
            for it in buffer:
                yield Chunk(it[0], it[1], 1, full=False)
            steps_left = None if steps_left is None else steps_left - len(buffer)
            buffer = []
        buffer.append(item)
        if steps_left is not None and steps_left < spe:
            for it in buffer:
                yield Chunk(it[0], it[1], 1, full=False)
            steps_left -= len(buffer)
            buffer = []
        elif len(buffer) == spe:
            stacked = jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *[it[0] for it in buffer])
            yield Chunk(stacked, sum(it[1] for it in buffer), spe, full=True)
            steps_left = None if steps_left is None else steps_left - spe
            buffer = []
    for it in buffer:  # the epoch's leftovers: one step each
        yield Chunk(it[0], it[1], 1, full=False)


# ------------------------------------------------------------------------------ host checks

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


def host_values(state: TrainState) -> dict[str, Any]:
    """Device values logged at every log time besides the metric accumulators."""
    ls = state.loss_scale
    if isinstance(ls, precision_lib.LossScale):
        return {"loss_scale": ls.scale, "skipped_steps": ls.skipped}
    return {}
