"""Builds the train state and the jitted functions for one (module, strategy) pair.

Everything here returns values; nothing mutates the trainer. `Compiled.train_step` is the single
jitted step of DESIGN.md: compiled once per batch shape, state donated, shardings from the strategy
(on CPU, a step with a large scratch is compiled a second time, as `_cpu_scratch` plans).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import optax

from fitjax import _cpu_scratch, _lightning, _resident, _techniques
from fitjax import metrics as acc_lib
from fitjax import step as step_lib
from fitjax._typing import Batch, PyTree
from fitjax.state import TrainState
from fitjax.strategies import Strategy


@dataclasses.dataclass(frozen=True)
class Compiled:
    """The jitted functions of one fit/eval run and the shardings they were built with."""

    state_shardings: Any
    metric_names: tuple[str, ...]
    train_step: Callable[[TrainState, Batch], tuple[TrainState, dict]] | None
    reset_metrics: Callable[[TrainState], TrainState] | None
    eval_step: Callable[..., Any]
    predict_step: Callable[..., Any]
    eval_metric_names: tuple[str, ...] = ()
    log_specs: dict[str, Any] = dataclasses.field(default_factory=dict)  # name -> `_logged.LogSpec`
    test_step: Callable[..., Any] | None = None  # a Lightning-style module's `test_step`
    test_metric_names: tuple[str, ...] = ()
    #: with `steps_per_execution > 1`: one optimizer step per call, for an epoch's leftovers
    train_tail_step: Callable[[TrainState, Any], tuple[TrainState, dict]] | None = None
    #: host step inputs -> device (`strategy.shard_batch` for plain batches; see `_techniques.Chunk`)
    shard_inputs: Callable[[Any, bool], Any] | None = None
    #: the plain step on `(block, base)`, a block of batches kept on the devices (`_resident`)
    resident_step: Callable[[TrainState, Any], tuple[TrainState, dict]] | None = None

    def evaluator(self, stage: str) -> tuple[Callable[..., Any], tuple[str, ...]]:
        """The eval step and its value names for "val" or "test"."""
        if stage == "test" and self.test_step is not None:
            return self.test_step, self.test_metric_names
        return self.eval_step, self.eval_metric_names


def check_optimizer(tx: Any, owner: str) -> optax.GradientTransformation:
    if isinstance(tx, optax.GradientTransformation) or (
        hasattr(tx, "init") and hasattr(tx, "update") and callable(tx.init) and callable(tx.update)
    ):
        return tx
    raise TypeError(
        f"{owner}.configure_optimizer must return an optax.GradientTransformation (e.g. "
        f"`optax.adamw(1e-3)`), got {type(tx).__name__}: {tx!r}."
    )


def _abstract(batch: Batch) -> Batch:
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), batch)


def build(module, strategy: Strategy, batch: Batch, *, seed: int, stage: str = "fit",
          techniques: _techniques.Techniques = _techniques.Techniques()
          ) -> tuple[TrainState | tuple[PyTree, PyTree, jax.Array], Compiled]:
    """Initialises (or reuses) the module's variables and compiles the step functions.

    With `stage="fit"` returns a sharded `TrainState` (optimizer state included); for "eval" and
    "predict" the sharded `(params, model_state, rng)` alone. `batch` is a host batch used for
    shapes (and, for Linen, traced through `loss` — `predict_step` for "predict" — to initialise).
    """
    owner = type(module).__name__
    train = stage == "fit"
    _lightning.check(module)
    binding = module._get_binding()
    given = module.variables or binding.initial_variables()
    abstract_batch = _abstract(batch)
    if stage == "predict":  # predict data may carry no labels: trace predict_step, check no loss
        names, trace = step_lib.StepNames(("loss",), ("loss",), {}), _lightning.predict_fn(module)
    else:
        names, trace = step_lib.check_step_outputs(module, binding, abstract_batch, given), None
    test_names = None
    if stage != "predict" and _lightning.is_lightning(module):  # test_step logs names of its own
        with _lightning.stage("test"):
            test_names = step_lib.check_step_outputs(module, binding, abstract_batch, given)
    metric_names = names.train
    tx = check_optimizer(module.configure_optimizer(), owner) if train else optax.identity()
    tx = techniques.wrap_optimizer(tx) if train else tx
    train_names = techniques.train_metric_names(metric_names) if train else metric_names

    init_fn = step_lib.make_init_fn(module, binding, tx, train_names, trace=trace)
    init_fn = techniques.wrap_init(init_fn, tx)
    abstract_state = jax.eval_shape(init_fn, jax.random.key(0), abstract_batch, given)
    shardings = strategy.state_shardings(abstract_state, binding.annotations)
    replicated = strategy.replicated
    batch_sharding = strategy.batch_sharding

    rng = jax.random.key(seed)
    sharded_batch = strategy.shard_batch(batch)
    if given is not None:
        # A copy, never an alias: the state is donated to the step, and these arrays belong to the
        # user's model (NNX) or to the module's last fit.
        given = jax.device_put(given, (shardings.params, shardings.model_state), may_alias=False)
    state = jax.jit(init_fn, out_shardings=shardings)(rng, sharded_batch, given)

    train_step = reset_metrics = tail_step = resident_step = None
    shard_inputs = lambda inputs, full: strategy.shard_batch(inputs)  # noqa: E731
    if train and techniques.is_plain:
        plain = _lightning.train_step(module, binding, tx)

        def jit_step(fn, inputs_sharding):
            """`fn` jitted with the state donated; on CPU, compiled as `_cpu_scratch` plans."""
            def jit(donate=True, compiler_options=None):
                return strategy.jit(fn, in_shardings=(shardings, inputs_sharding),
                                    out_shardings=(shardings, replicated),
                                    donate_argnums=(0,) if donate else (), compiler_options=compiler_options)
            return _cpu_scratch.step(jit, platform=strategy.platform)

        train_step = jit_step(plain, batch_sharding)
        # compiled only if used: see `_resident`
        resident_step = jit_step(_resident.picking(plain), (_resident.block_sharding(strategy), replicated))
    elif train:
        _lightning.check_techniques(module)
        train_step, tail_step, shard_inputs = _techniques.jit_train_steps(
            module, binding, tx, techniques, train_names, strategy, shardings)
    if train:
        # Fresh zeros from a call with no arguments: a jitted `state -> state` would pass every
        # leaf of the state through XLA, which on CPU costs ~3 µs a leaf.
        zero_metrics = strategy.jit(lambda: acc_lib.zeros(train_names), in_shardings=(),
                                    out_shardings=shardings.metrics)
        reset_metrics = lambda s: s.replace(metrics=zero_metrics())  # noqa: E731
    def jit_eval(stage_name: str):
        return strategy.jit(
            techniques.wrap_eval(_lightning.eval_step(module, binding, stage_name), batch_arg=4),
            in_shardings=(shardings.params, shardings.model_state, replicated, replicated,
                          batch_sharding, batch_sharding),
            out_shardings=replicated,
            donate_argnums=(3,),
        )

    eval_step = jit_eval("val")
    predict_step = strategy.jit(
        techniques.wrap_eval(step_lib.make_predict_step(module, binding, fn=_lightning.predict_fn(module)),
                             batch_arg=3),
        in_shardings=(shardings.params, shardings.model_state, replicated, batch_sharding),
        out_shardings=batch_sharding,
    )
    log_specs = {**(test_names.log_specs if test_names else {}), **names.log_specs}
    compiled = Compiled(shardings, metric_names, train_step, reset_metrics, eval_step, predict_step,
                        eval_metric_names=names.eval, log_specs=log_specs,
                        train_tail_step=tail_step, shard_inputs=shard_inputs, resident_step=resident_step,
                        test_step=jit_eval("test") if test_names else None,
                        test_metric_names=test_names.eval if test_names else ())
    return (state if train else (state.params, state.model_state, state.rng)), compiled
