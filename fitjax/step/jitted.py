"""Builds the train state and the jitted step functions for one (module, strategy) pair.

Everything here returns values; nothing mutates the trainer. Every jitted train step variant
(a full call, an epoch's leftover steps, a call picking its batches from a block on the device)
goes through `_jit_train`, the one place where a train step's platform-specific compile choices
are made: the state is donated, and on XLA:CPU the program is compiled as `xla_cpu` plans. Every
program (train steps, the evaluation and predict steps) is jitted by `compiling.jit`, with its
platform's options (`compiler_options`: `xla_cpu`'s on CPU, `xla_tpu`'s on TPU); the state's init
gets the same options from a raw `jax.jit` (see `build`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Iterable, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from fitjax import metrics as acc_lib
from fitjax._typing import Batch
from fitjax.state import TrainState
from fitjax.step import compiling, context, forward, hlo_loops, offload, train, trainable, xla_cpu, xla_gpu
from fitjax.step.compiling import compiler_options
from fitjax.step.module_spec import ModuleSpec
from fitjax.step.options import StepOptions
from fitjax.strategies import Strategy, with_model_rules

__all__ = ["AbstractTrain", "Compiled", "EvalStep", "KeyAside", "StepBuild", "StepCost", "abstract_init", "abstract_train", "block_sharding", "build",
           "check_optimizer", "compiler_options", "cost_of", "step_inputs", "step_memory_bytes",
           "train_step_cost"]


class EvalStep(NamedTuple):
    """One evaluation's jitted step, the names of the values it returns and their log options."""

    step: Callable[..., Any]
    names: dict[str, Any]  # name -> None (a mean) or the metric (`fitjax.metrics.zeros`'s slots)
    log_specs: dict[str, Any]  # name -> `_logged.LogSpec`
    #: the same step also returning what the user's step returned and appended, for the
    #: batch-end hooks (`forward.make_eval_step(returns=True)`); compiled only when first called
    returning: Callable[..., Any] | None = None
    #: the module's lists the evaluation hook appends to (`self.validation_step_outputs`)
    appends: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Compiled:
    """The jitted programs of one fit/eval run and the shardings they were built with (each
    compiles when first called)."""

    state_shardings: Any
    #: the step options the train programs were made for
    options: StepOptions
    #: how each logged name is shown and logged (name -> `_logged.LogSpec`)
    log_specs: dict[str, Any]
    #: `predict_step(params, model_state, rng, batch) -> outputs`
    predict_step: Callable[..., Any]
    #: "val" and "test" -> the evaluation's step (the same one unless the module has a
    #: `test_step` of its own)
    eval_steps: Mapping[str, EvalStep]
    #: `(stage, dataloader_idx) -> EvalStep` of a loader after the first, for a module whose
    #: evaluation reads the loader index (None: every loader shares one)
    loader_eval_step: Callable[[str, int], EvalStep] | None = None
    # The train programs (None when built for "eval" or "predict"), made together for one
    # `StepOptions` (`_TRAIN_PROGRAMS`):
    #: one full call: `steps_per_execution` optimizer steps on host inputs (see `StepInputs`)
    train_step: Callable[[TrainState, Any], tuple[TrainState, dict]] | None = None
    #: one optimizer step per call, for an epoch's leftovers (`train_step` itself when
    #: `steps_per_execution == 1`)
    train_tail_step: Callable[[TrainState, Any], tuple[TrainState, dict]] | None = None
    #: one call on `(block, base, count)`, its batches picked from a block on the device: a
    #: full call, or an epoch's last accumulation group (`count` real micro-batches)
    block_step: Callable[[TrainState, Any], tuple[TrainState, dict]] | None = None
    #: host step inputs -> device (`StepInputs.inputs`, `full` or not)
    shard_inputs: Callable[[Any, bool], Any] | None = None
    #: `state -> state` with the train metric accumulators zeroed
    reset_metrics: Callable[[TrainState], TrainState] | None = None
    #: `() -> dict`: XLA's cost analysis of one full call of the train step, per device
    #: (`StepCost`); compiles a program when called, unless the step has run
    train_step_cost: "StepCost | None" = None
    #: `options -> {name: program}` of the train programs for other options (another
    #: `accumulate_grad_batches`) on the same state and shardings
    train_programs_for: Callable[[StepOptions], dict[str, Any]] | None = None

    def with_options(self, options: StepOptions, programs: dict[str, Any] | None = None) -> "Compiled":
        """These programs with the train programs for `options` (`programs`: made before by
        `train_programs_for(options)`, reused so that nothing compiles again)."""
        programs = programs if programs is not None else self.train_programs_for(options)
        return dataclasses.replace(self, options=options, **programs)

    def train_programs(self) -> dict[str, Any]:
        """The train programs, as `train_programs_for` returns them."""
        return {name: getattr(self, name) for name in _TRAIN_PROGRAMS}

    def evaluator(self, stage: str, dataloader_idx: int = 0) -> EvalStep:
        """The eval step, its value names and their log specs for "val" or "test" on the loader
        `dataloader_idx` (one step for every loader unless the module reads the index)."""
        if dataloader_idx and self.loader_eval_step is not None:
            return self.loader_eval_step(stage, dataloader_idx)
        return self.eval_steps[stage]


class StepBuild(NamedTuple):
    """What `build` gives: the sharded train state and the jitted programs built for it."""

    state: TrainState
    compiled: Compiled


_TRAIN_PROGRAMS = ("train_step", "train_tail_step", "block_step", "shard_inputs", "reset_metrics", "train_step_cost")


def block_sharding(strategy: Strategy) -> NamedSharding:
    """Blocks `[n, batch, ...]` of batches are split over the devices like a batch, on axis 1."""
    return stacked_sharding(strategy.batch_sharding, 1)


def stacked_sharding(batch_sharding: NamedSharding, leading: int) -> NamedSharding:
    """`batch_sharding` with `leading` unsharded dimensions in front (steps, micro-batches)."""
    return NamedSharding(batch_sharding.mesh, P(*([None] * leading), *batch_sharding.spec))


def check_optimizer(tx: Any, owner: str) -> optax.GradientTransformation:
    if isinstance(tx, optax.GradientTransformation) or (
        hasattr(tx, "init") and hasattr(tx, "update") and callable(tx.init) and callable(tx.update)
    ):
        return tx
    raise TypeError(
        f"{owner}.configure_optimizer must return an optax.GradientTransformation (e.g. "
        f"`optax.adamw(1e-3)`), got {type(tx).__name__}: {tx!r}."
    )


def train_optimizer(spec: ModuleSpec, options: StepOptions) -> optax.GradientTransformation:
    """The module's optimizer with clipping chained first, over the parameters it trains
    (`fitjax.step.trainable`: those it freezes get no gradient and no state)."""
    tx = check_optimizer(spec.optimizer(), spec.owner)
    return trainable.restrict(options.wrap_optimizer(tx, groups=spec.manual), trainable.of(tx))


def _abstract(batch: Batch) -> Batch:
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), batch)


def build(spec: ModuleSpec, strategy: Strategy, batch: Batch, *, seed: int, purpose: str = "fit",
          options: StepOptions = StepOptions(), runs: Any = None) -> StepBuild:
    """Initialises (or reuses) the module's variables and makes the jitted programs for
    `purpose`: "fit" (train, eval and predict), "eval" or "predict".

    The state is a sharded `TrainState`; only "fit" builds the optimizer and its state (for
    "eval" and "predict" the optimizer is `optax.identity()`). `batch` is a host batch used for
    shapes (and, for Linen, traced through `loss` — `predict` for "predict" — to initialise).
    `spec` is all the step reads of the module (`LitModule.step_spec()`).

    `runs` (a `fitjax.runs.RunAxis`, or None) trains several runs side by side: it wraps the
    init, each train, eval and predict function (a `vmap` over a leading axis of the state) and
    names the accumulators per run; everything else here is the same.
    """
    runs = runs or _NoRuns()
    strategy = with_model_rules(strategy, spec.axis_rules)  # the model's logical names, where the user gave none
    fit = purpose == "fit"
    binding = spec.binding
    given = spec.variables
    abstract_batch = _abstract(batch)
    loader_index = context.LoaderIndex()  # read while tracing: a step per evaluation loader
    if purpose == "predict":  # predict data may carry no labels: trace predict, check no loss
        names, trace = forward.StepNames(("loss",), ("loss",), {}), "predict"
    else:
        with context.dataloader_index(loader_index):
            names, trace = forward.check_step_outputs(spec, abstract_batch, given), "loss"
    test_names = None
    # the abstract variables the names were found with: other stages and loaders trace eval mode only
    abstract_given = names.variables if names.variables is not None else None if given is None else _abstract(given)
    if purpose != "predict" and "test" in spec.eval_stages:  # test_step logs names of its own
        with context.stage("test"), context.dataloader_index(loader_index):
            test_names = forward.check_step_outputs(spec, abstract_batch, abstract_given, train=False)
    tx = train_optimizer(spec, options) if fit else optax.identity()
    train_names = names.slots(options.train_metric_names(names.train) if fit else names.train, train=True)

    init_fn = forward.make_init_fn(spec, tx, train_names, trace=trace)
    # under the mesh: a kernel XLA cannot partition (`fj.nn.attention`'s) is split over it
    init_fn = strategy.traced_on_mesh(runs.init(options.wrap_init(init_fn, tx)))
    abstract_state = jax.eval_shape(init_fn, jax.random.key(0), abstract_batch, given)
    # what `Trainer(offload=...)` keeps in host memory (only a fit has an optimizer state)
    on_devices = strategy.state_shardings(abstract_state, binding.annotations)
    shardings = offload.place(on_devices, options.offload if fit else "none")
    replicated = strategy.replicated
    batch_sharding = strategy.batch_sharding

    rng = jax.random.key(seed)
    sharded_batch = strategy.shard_batch(batch)
    # the variables given to the init, in device memory: the init's outputs go where `shardings` say
    variable_shardings = (on_devices.params, on_devices.model_state)
    if given is not None:
        # A copy, never an alias: the state is donated to the step, and these arrays belong to the
        # user's model (NNX) or to the module's last fit.
        given = jax.device_put(given, variable_shardings, may_alias=False)
    if spec.weights is not None:  # weights from outside, read straight into their shardings
        def initial(given=given):  # the model's own values, for what the source does not give
            if given is not None:
                return given
            with xla_gpu.rng_kernels(strategy.platform):
                return compiling.jit(strategy, lambda r, b: _variables(init_fn(r, b, None)),
                                out_shardings=variable_shardings)(rng, sharded_batch)
        given = spec.weights((abstract_state.params, abstract_state.model_state), variable_shardings, initial)
    with xla_gpu.rng_kernels(strategy.platform):  # GPU: the init's draws compile in seconds, same bits
        # raw `jax.jit`, not `compiling.jit`: `Strategy.jit` wraps `init_fn` anew, and a new function retraces the
        # module's loss `eval_shape` traced above (tests/loop/test_setup.py counts the traces)
        state = jax.jit(init_fn, out_shardings=shardings, compiler_options=compiler_options(strategy.platform))(
            rng, sharded_batch, given)

    programs = {}
    if fit:
        def train_programs_for(other: StepOptions) -> dict[str, Any]:
            made = _train_programs(spec, tx, other, train_names, strategy, shardings, runs,
                                   abstract=(abstract_state, abstract_batch))
            make, unrolled = made.pop("make"), made.pop("loops_unrolled")
            made["train_step_cost"] = StepCost(lambda: train_step_cost(  # the step as it runs, loops and all
                make(single=False, unrolled=unrolled), strategy, shardings, other, abstract_state, abstract_batch))
            return made

        programs = {**train_programs_for(options), "train_programs_for": train_programs_for}

    def jit_eval(stage: str, dataloader_idx: int = 0, returns: bool = False) -> Callable[..., Any]:
        # every output replicated: the returned rows too (each process reads the whole batch's)
        return compiling.jit(
            strategy,
            runs.eval_step(forward.make_eval_step(spec, options.precision, stage, dataloader_idx, returns=returns)),
            in_shardings=(shardings.params, shardings.model_state, replicated, replicated,
                          batch_sharding, batch_sharding, replicated),
            out_shardings=replicated,
            donate_argnums=(3,),
        )

    predict_step = compiling.jit(
        strategy,
        runs.predict_step(forward.make_predict_step(spec, options.precision)),
        in_shardings=(shardings.params, shardings.model_state, replicated, batch_sharding),
        out_shardings=batch_sharding,
    )
    log_specs = {**(test_names.log_specs if test_names else {}), **names.log_specs}
    def eval_step(stage: str, found: forward.StepNames, specs: dict, dataloader_idx: int = 0) -> EvalStep:
        returning = jit_eval(stage, dataloader_idx, returns=True)
        return EvalStep(jit_eval(stage, dataloader_idx), runs.slots(found.slots(found.eval, train=False)), specs,
                        returning, found.eval_appends if returning is not None else ())

    val = eval_step("val", names, log_specs)
    test = eval_step("test", test_names, log_specs) if test_names else val

    @functools.cache
    def loader_eval_step(stage: str, dataloader_idx: int) -> EvalStep:
        """Another loader's step: its names traced again (a hook may log others for it)."""
        with context.stage(stage), context.dataloader_index(dataloader_idx):
            loader_names = forward.check_step_outputs(spec, abstract_batch, abstract_given, train=False)
        return eval_step(stage, loader_names, {**log_specs, **loader_names.log_specs}, dataloader_idx)

    compiled = Compiled(shardings, options, log_specs, predict_step, {"val": val, "test": test},
                        loader_eval_step=loader_eval_step if loader_index.read else None, **programs)
    return StepBuild(state, compiled)


class _NoRuns:
    """One run: every wrap is the identity."""

    def init(self, fn: Callable, **_) -> Callable:
        return fn

    step = eval_step = predict_step = init

    def slots(self, names: dict[str, Any]) -> dict[str, Any]:
        return names


class AbstractTrain(NamedTuple):
    """The train program `fit` would compile, with nothing allocated (`abstract_train`)."""

    #: the train state as `jax.ShapeDtypeStruct`s carrying the strategy's shardings
    state: TrainState
    #: one full call's inputs as `jax.ShapeDtypeStruct`s (`step_inputs`)
    inputs: Any
    #: the donated, jitted `train_step(state, inputs)` fit runs (to `.lower(state, inputs)`)
    train_step: Callable[..., Any]


def step_inputs(batch: Batch, options: StepOptions, *, processes: int = 1) -> Any:
    """Abstract inputs of one full train-step call on batches shaped like `batch` (one
    process's; the step takes `processes` times its rows): `[steps, micro-batches, batch, ...]`
    stacked in front as `steps_per_execution` and `accumulate_grad_batches` ask, with the
    micro-batch mask when accumulating."""
    k, spe = options.accumulate_grad_batches, options.steps_per_execution
    lead = ((spe,) if spe > 1 else ()) + ((k,) if k > 1 else ())
    stacked = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct((*lead, x.shape[0] * processes, *x.shape[1:]), x.dtype), batch)
    return (stacked, jax.ShapeDtypeStruct(lead, jnp.bool_)) if k > 1 else stacked


def abstract_train(spec: ModuleSpec, strategy: Strategy, batch: Batch, *,
                   options: StepOptions = StepOptions()) -> AbstractTrain:
    """The train step `build(..., purpose="fit")` makes for `strategy` and `options`, on an
    abstract state: the same initialisation traced with `jax.eval_shape`, the same shardings,
    the same step function and jit arguments, so lowering it (`train_step.lower(state,
    inputs)`) compiles the program fit would run, for the strategy's devices (which need not
    be this machine's: a TPU topology compiles deviceless) and without allocating the state.

    `batch` gives shapes and dtypes only (arrays or `jax.ShapeDtypeStruct`s) of the whole
    batch one step takes."""
    strategy, abstract_batch, tx, train_names, _, abstract_state, shardings = _abstract_init(
        spec, strategy, batch, options)
    state = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract_state, shardings)
    made = _train_programs(spec, tx, options, train_names, strategy, shardings,
                           abstract=(abstract_state, abstract_batch))
    make, spe = made["make"], options.steps_per_execution
    inputs_sharding = _host_sharding(strategy, options, 1 if spe > 1 else 0)
    step = _jit_train(make(single=False, unrolled=made["loops_unrolled"]), strategy, shardings, inputs_sharding)
    return AbstractTrain(state, step_inputs(abstract_batch, options), step)


def _abstract_init(spec: ModuleSpec, strategy: Strategy, batch: Batch, options: StepOptions):
    """What `abstract_train` and `abstract_init` share: the strategy with the model's rules, the
    abstract batch, the optimizer, the metric names, the init function, the abstract state and
    its shardings."""
    strategy = with_model_rules(strategy, spec.axis_rules)
    abstract_batch = _abstract(batch)
    given = None if spec.variables is None else _abstract(spec.variables)
    names = forward.check_step_outputs(spec, abstract_batch, given)
    tx = train_optimizer(spec, options)
    train_names = options.train_metric_names(names.train)
    init_fn = options.wrap_init(forward.make_init_fn(spec, tx, train_names, trace="loss"), tx)
    abstract_state = jax.eval_shape(init_fn, jax.random.key(0), abstract_batch, given)
    shardings = offload.place(strategy.state_shardings(abstract_state, spec.binding.annotations), options.offload)
    return strategy, abstract_batch, tx, train_names, init_fn, abstract_state, shardings


def abstract_init(spec: ModuleSpec, strategy: Strategy, batch: Batch, *,
                  options: StepOptions = StepOptions()) -> tuple[Callable[..., Any], tuple]:
    """The program `build(..., purpose="fit")` runs to make a state of random weights (no
    variables held, no weight source), and its abstract arguments: `init.lower(*args).compile()`
    compiles it for the strategy's devices (a TPU topology deviceless), and its memory analysis
    is what making the state holds at its peak: for a QLoRA model, whether each float weight is
    freed once quantized or the whole float model is held.

    Example:
        >>> # init, args = abstract_init(module.step_spec(), strategy, batch)
        >>> # init.lower(*args).compile().memory_analysis().temp_size_in_bytes
    """
    strategy, abstract_batch, _, _, init_fn, _, shardings = _abstract_init(spec, strategy, batch, options)
    init = jax.jit(strategy.traced_on_mesh(init_fn), out_shardings=shardings,
                   compiler_options=compiler_options(strategy.platform))
    batch_sharding = strategy.batch_sharding
    args = (jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=strategy.replicated),
            jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=batch_sharding), abstract_batch),
            None)
    return init, args


def _host_sharding(strategy: Strategy, options: StepOptions, leading: int):
    """Host inputs: stacked dimensions (steps, micro-batches) unsharded, the batch's kept; the
    micro-batch mask replicated."""
    if options.accumulate_grad_batches > 1:
        return stacked_sharding(strategy.batch_sharding, leading + 1), strategy.replicated
    return stacked_sharding(strategy.batch_sharding, leading)


def _jit_train(fn: Callable, strategy: Strategy, shardings, inputs_sharding, *, donate: bool = True,
               options: dict | None = None) -> "KeyAside":
    """`fn(state, inputs)` jitted with the state's shardings (donated unless `donate=False`), its
    random key passed beside the state (`KeyAside`)."""
    def keyed(state, key, inputs):
        return _without_key(fn(state.replace(rng=key), inputs))

    keyed.__name__ = keyed.__qualname__ = getattr(fn, "__name__", "train_step")  # compile logs name it
    # what the state keeps in host memory (`Trainer(offload=...)`) the step fetches itself, late
    return KeyAside(compiling.jit(strategy, keyed, in_shardings=(shardings.replace(rng=None), shardings.rng,
                                                                 inputs_sharding),
                                  out_shardings=(shardings.replace(rng=None), strategy.replicated),
                                  donate_argnums=(0,) if donate else (), options=options, fetch_host=False))


def _without_key(outputs: tuple[TrainState, Any]) -> tuple[TrainState, Any]:
    state, values = outputs
    return state.replace(rng=None), values


class KeyAside:
    """A jitted train step called as `step(state, inputs)`, its program taking the state's random
    key as an argument of its own and not returning it: a train step never changes the key (each
    step's keys are `fold_in(rng, step)`), and a typed key leaving a jitted call is made again in
    Python by JAX (`PRNGKeyArray`'s unflatten and checks: 15 Python calls, ~8 µs of host CPU a
    call on XLA:CPU, where a call of the tiny MLP's 32 steps is ~100 µs), every call of the step.
    The state given keeps its key; the state returned has the same key object."""

    __slots__ = ("jitted",)

    def __init__(self, jitted: Callable) -> None:
        self.jitted = jitted  # `jitted(state without its key, key, inputs)`

    def __call__(self, state: TrainState, inputs: Any) -> tuple[TrainState, Any]:
        key = state.rng
        new, values = self.jitted(state.with_fields(rng=None), key, inputs)
        return new.with_fields(rng=key), values

    def lower(self, state: TrainState, inputs: Any) -> Any:
        """The lowered program for these arguments (`jax.jit(...).lower`)."""
        return self.jitted.lower(state.replace(rng=None), state.rng, inputs)


def _train_programs(spec: ModuleSpec, tx, options: StepOptions, train_names, strategy: Strategy, shardings,
                    runs: Any = None, *, abstract: tuple[Any, Any]) -> dict[str, Any]:
    """The jitted train step variants, the host-input sharding and the metric reset (and `make`,
    which makes a train step function); `runs` (see `build`) wraps each step. `abstract`: the
    abstract state and one step's batch, to trace the step with."""
    runs = runs or _NoRuns()
    k, spe = options.accumulate_grad_batches, options.steps_per_execution
    replicated = strategy.replicated

    def host_sharding(leading: int):
        return _host_sharding(strategy, options, leading)

    def jit_train(fn: Callable, inputs_sharding, single: bool) -> Callable:
        """`fn(state, inputs)` jitted with the state donated; on CPU compiled as `xla_cpu` plans."""
        def jit(donate: bool = True, compiler_options: dict | None = None):
            return _jit_train(runs.step(fn, stacked=stacked(single)), strategy, shardings, inputs_sharding,
                              donate=donate, options=compiler_options)
        return xla_cpu.step(jit, platform=strategy.platform)

    def make(single: bool, unrolled: bool = False) -> Callable:
        return train.make_train_step(spec, tx, options, train_names, single=single, unrolled=unrolled)

    def stacked(single: bool) -> int:  # the dimensions (steps, micro-batches) in front of a call's batches
        return (0 if single or spe == 1 else 1) + (k > 1)

    # loops (accumulation, several steps a call) unrolled where the platform runs them slowly
    unrolled = (k > 1 or spe > 1) and xla_cpu.unrolls_loops(
        platform=strategy.platform, step_fn=runs.step(make(single=False), stacked=stacked(False)),
        state=abstract[0], inputs=step_inputs(abstract[1], options), trips=k * spe)
    full_leading = 1 if spe > 1 else 0
    full = make(single=False, unrolled=unrolled)
    train_step = jit_train(full, host_sharding(full_leading), single=False)
    tail_step = (jit_train(make(single=True, unrolled=unrolled), host_sharding(0), single=True) if spe > 1
                 else train_step)
    # compiled only if used (a block step runs only when the data is kept on the devices)
    block_step = jit_train(train.picking(full, options), (block_sharding(strategy), replicated, replicated),
                           single=False)

    def shard_inputs(inputs, is_full: bool):
        target = host_sharding(full_leading if is_full else 0)
        if k > 1:
            return _put(inputs[0], target[0]), _put(inputs[1], target[1])
        return _put(inputs, target)

    # Fresh zeros for each log window (a jitted `state -> state` would also pass every leaf of
    # the state through XLA, ~3 µs a leaf on CPU): made on the devices by a program of no
    # inputs when the accumulators are means only, else placed from the host.
    slots = runs.slots(train_names)
    make_zeros = _zeros_program(tuple(slots), shardings.metrics) if _means_only(slots, shardings.metrics) else None

    made: list = []  # zeros made ahead by `make_zeros`, taken one a window

    def zero_metrics() -> Any:
        if make_zeros is None:
            return strategy.put(acc_lib.zeros(slots, host=True), shardings.metrics)
        if not made:
            made.extend(make_zeros())
        return made.pop()

    return {"train_step": train_step, "train_tail_step": tail_step, "block_step": block_step,
            "shard_inputs": shard_inputs, "reset_metrics": lambda s: s.with_fields(metrics=zero_metrics()),
            "make": lambda single, unrolled=False: runs.step(make(single, unrolled), stacked=stacked(single)),
            "loops_unrolled": unrolled}


def _means_only(slots: Iterable[str] | Mapping[str, Any], shardings: Any) -> bool:
    """Whether the accumulators `slots` (names of means, or `name -> template`, None a mean) are
    all means, each laid out by one sharding of its own (`shardings`: the state's metrics
    shardings), in one process."""
    templates = slots if isinstance(slots, Mapping) else dict.fromkeys(slots)
    return (jax.process_count() == 1 and isinstance(shardings, Mapping) and set(shardings) == set(templates)
            and all(template is None for template in templates.values())
            and all(isinstance(sharding, jax.sharding.Sharding) for sharding in shardings.values()))


_ZEROS_AHEAD = 16  # the windows' zeros one call of `_zeros_program` makes


@functools.lru_cache(maxsize=32)
def _zeros_for(names: tuple[str, ...], shardings: tuple[jax.sharding.Sharding, ...]) -> Callable[[], Any]:
    layout = dict(zip(names, shardings))

    def zeros_ahead() -> tuple[dict[str, jax.Array], ...]:
        return tuple(acc_lib.zeros(names) for _ in range(_ZEROS_AHEAD))

    return jax.jit(zeros_ahead, out_shardings=(layout,) * _ZEROS_AHEAD)


def _zeros_program(names: tuple[str, ...], shardings: Mapping[str, jax.sharding.Sharding]) -> Callable[[], Any]:
    """`_ZEROS_AHEAD` accumulators of the means `names`, as zeros on the devices, made by one
    jitted program of no inputs, compiled once per process for each names and layout (every fit
    shares it).

    A log window swaps the state's accumulators for zeros, and with `steps_per_execution` most
    calls end at a log step: placing them from the host (`Strategy.put`) was ~15% of the main
    thread's CPU time of `benchmarks/overhead.py --only spe` (tiny MLP, 32 steps a call) on
    XLA:CPU, a host-to-device transfer per window; a dispatch per window was ~25 µs of it, one
    per 16 windows (a few bytes each) about a sixteenth."""
    return _zeros_for(names, tuple(shardings[name] for name in names))


def train_step_cost(step_fn: Callable, strategy: Strategy, shardings, options: StepOptions, abstract_state,
                    abstract_batch) -> dict[str, float]:
    """XLA's cost analysis (`flops`, `bytes accessed`, ...) of one full call of `step_fn` on
    batches shaped like `abstract_batch` (this process's), as compiled for one device of the
    strategy's mesh: the partitioned program each device runs.

    `step_fn` is the train step as fit runs it: its scans over micro-batches and steps (and a
    model's own, such as scanned layers) are counted once per iteration by `cost_of`, where
    XLA's analysis counts a loop body once. Compiled once per call of this function, with the
    step's own shardings and nothing donated.
    """
    leading = 1 if options.steps_per_execution > 1 else 0

    def train_step_flops(state, inputs):  # its own name: its compile is no second train step's
        return step_fn(state, inputs)

    jitted = _jit_train(train_step_flops, strategy, shardings, _host_sharding(strategy, options, leading),
                        donate=False)
    inputs = step_inputs(abstract_batch, options, processes=jax.process_count())
    return cost_of(jitted.lower(abstract_state, inputs).compile())


class StepCost:
    """XLA's cost analysis of one full call of the train step, per device, when called.

    Once the loop has `record`ed a call of the step it runs (the train step, or the block step
    that picks its batches on the devices: the same step and a gather), that program is the one
    analysed, and it is not compiled again: JAX gives `step.lower(...).compile()` the executable
    `step(...)` compiled, for arguments shaped, typed and placed alike. Before any call (read at
    `on_fit_start`) the step is compiled on its own, as a program named `train_step_flops`
    (`count`). A second compilation of the step only to count it had doubled the start of a
    fit reporting its MFU (the GPT example's ThroughputMonitor)."""

    __slots__ = ("_count", "_ran")

    def __init__(self, count: Callable[[], dict[str, float]]) -> None:
        self._count = count
        self._ran: tuple[Any, Any, Any] | None = None

    @property
    def recorded(self) -> bool:
        return self._ran is not None

    def record(self, step: Any, state: TrainState, inputs: Any) -> None:
        """`step(state, inputs)` is a full call (every step of a call, not a shorter tail) about
        to run: its arguments' shapes, types and placements are kept (not the arrays)."""
        self._ran = (step, _abstract(state), _abstract(inputs))

    def __call__(self) -> dict[str, float]:
        if self._ran is None:
            return self._count()
        step, state, inputs = self._ran
        return cost_of(step.lower(state, inputs).compile())


def _abstract(tree: Any) -> Any:
    """`tree` with each array as a `jax.ShapeDtypeStruct` of its shape, dtype, sharding and weak
    type (a program lowered for it is the one the arrays' call compiled)."""
    def leaf(x: Any) -> Any:
        if isinstance(x, jax.Array):
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding, weak_type=getattr(x, "weak_type", False))
        if isinstance(x, np.ndarray | np.generic):
            return jax.ShapeDtypeStruct(x.shape, x.dtype)
        return x
    return jax.tree.map(leaf, tree)


def step_memory_bytes(memory_analysis: Any) -> int:
    """Bytes a compiled program holds per device at its peak, as XLA reports them: its arguments
    and outputs (a donated argument counted once: XLA reports it as aliased) and its scratch."""
    m = memory_analysis
    return int(m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
               + m.temp_size_in_bytes)


def cost_of(compiled: Any, hlo_text: str | None = None) -> dict[str, float]:
    """A compiled program's `cost_analysis()` as `{name: float}` (`flops`, `bytes accessed`, ...),
    each loop body counted once per iteration (`fitjax.step.hlo_loops`: XLA counts it once).
    `hlo_text`: `compiled.as_text()` when the caller has it already."""
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):  # older jaxlibs: one dict per program
        cost = cost[0] if cost else {}
    cost = {key: float(value) for key, value in (cost or {}).items() if isinstance(value, (int, float))}
    return hlo_loops.per_iteration(compiled.as_text() if hlo_text is None else hlo_text, cost)


def _variables(state: TrainState) -> tuple[Any, Any]:
    return state.params, state.model_state


def _put(tree, sharding):
    if jax.process_count() == 1:  # host arrays: the jitted step's in_shardings place them
        return tree
    return jax.tree.map(lambda x: jax.make_array_from_process_local_data(sharding, x), tree)
