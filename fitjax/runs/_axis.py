"""`RunAxis`: several runs of one fit as one program, a `vmap` over a leading axis of the state.

Every leaf of the `TrainState` gains a leading axis of `size` runs, except the step count (the
runs step together) and the metric
accumulators: those are kept per run under their own names (`loss/run_0`, `loss/run_1`, ...), so
the loop, the loggers and the callbacks see plain scalars, as with one run, and every logged
value is per run (`train/loss/run_3`, `val/acc/run_3`). The wraps below stack them for the
vmapped function and name them again after it: slices and concatenations of a few scalars
inside the compiled program.

The batch is the same for every run (not vmapped): same data, same order; or, from a
`DataLoader(shuffle="per_run")` (`RunOrders`), each run's own rows on the axis after the batch's
(`per_run_data`), vmapped there. Each run's key is
its own seed's (`jax.random.key(seed)`), so run i is bitwise the key of a fit with that seed.
Hyperparameters that differ between runs are read by the user's code through `self.hparams`
while it is traced (`fitjax.step.context.run_hparams`): a traced array holding the run's value.
"""

from __future__ import annotations

import dataclasses
import os
import traceback
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fitjax.state import TrainState
from fitjax.step import ModuleSpec, context
from fitjax.step.jitted import check_optimizer
from fitjax.step.train import OUTPUTS_KEY

__all__ = ["RunAxis", "active_runs", "member", "run_suffix", "stop_run"]

_SUFFIX = "/run_"
# Every leaf of the state has the runs axis but the step count, which all runs share: they step
# together (a stopped run's update is masked, its count goes on), and the step picks each call's
# batch from a block on the device by it.
_STATE_AXES = TrainState(step=None, params=0, model_state=0, opt_state=0, rng=0, metrics=0, loss_scale=0, extras=0)
_ACTIVE = "runs_active"  # `TrainState.extras[_ACTIVE]`: bool [runs], False once a run stopped early
# what JAX raises when a traced value is used where a Python one is needed (an `if`, `int()`, a
# NumPy conversion); a shape from one is a plain `TypeError` naming the tracer
_TRACER_ERRORS = (jax.errors.ConcretizationTypeError, jax.errors.TracerIntegerConversionError,
                  jax.errors.TracerBoolConversionError, jax.errors.TracerArrayConversionError)
_FITJAX = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # frames here are not the user's


def stop_run(state: TrainState, i: int) -> TrainState:
    """`state` with run `i` stopped: the steps leave its parameters, optimizer and model state as
    they are (the others go on)."""
    active = state.extras[_ACTIVE]
    return state.replace(extras={**state.extras, _ACTIVE: _stopped(active, i)})


def active_runs(state: TrainState) -> list[bool]:
    """Which runs still train (a host read: waits for the steps dispatched before)."""
    return [bool(a) for a in jax.device_get(state.extras[_ACTIVE])]


@jax.jit
def _stopped(active: jax.Array, i: jax.Array | int) -> jax.Array:
    return active.at[i].set(False)


@jax.jit
def member(tree: Any, i: jax.Array | int) -> Any:
    """Run `i`'s part of `tree` (every leaf with a leading runs axis), in one program: eager
    slices would compile one program per leaf shape."""
    return jax.tree.map(lambda x: x[i], tree)


def _one_by_one(fn: Callable, *, in_axes: tuple, out_axes: Any) -> Callable:
    """`jax.vmap(fn, in_axes, out_axes)` computed run by run (`jax.lax.map`). `in_axes`: 0 or
    None per argument; `out_axes`: 0 or None per leaf of its tree (None: the runs' results are
    the same, run 0's is taken)."""
    assert all(axis in (0, None) for axis in in_axes), in_axes

    def over_runs(*args: Any) -> Any:
        def one(mapped: list) -> Any:
            values = iter(mapped)
            return fn(*(next(values) if axis == 0 else arg for arg, axis in zip(args, in_axes)))

        out = jax.lax.map(one, [arg for arg, axis in zip(args, in_axes) if axis == 0])
        return jax.tree.map(lambda axis, tree: tree if axis == 0 else jax.tree.map(lambda x: x[0], tree),
                            out_axes, out, is_leaf=lambda x: x is None)

    return over_runs


def run_suffix(i: int) -> str:
    """What the keys of run `i`'s values end with: `/run_<i>` (as Lightning's `/dataloader_idx_<i>`)."""
    return f"{_SUFFIX}{i}"


class RunAxis:
    """The wraps `fitjax.step.build(runs=...)` applies for `len(seeds)` runs side by side.

    Args:
        seeds: each run's seed (its parameter init and random streams).
        hparams: each run's hyperparameters over the module's (dicts of the same keys), or None.
        owner: the module's class name, for errors.
        vmap: how the runs are vmapped: `jax.vmap`, or the platform's (`fitjax.step.xla_cpu.runs_vmap`).
    """

    def __init__(self, seeds: Sequence[int], hparams: Sequence[Mapping[str, Any]] | None, owner: str, *,
                 vmap: Callable[..., Callable] = jax.vmap, module_type: type | None = None):
        self.size = len(seeds)
        self.owner = owner
        self._module_type = module_type  # whose methods' lines an error about a hyperparameter names
        # the vmap of the platform (`xla_cpu.runs_vmap`: on CPU, convolutions computed per run)
        self._vmap = vmap
        # made here, outside any trace: run i's key is exactly `jax.random.key(seeds[i])`
        self._key_data = np.stack([np.asarray(jax.random.key_data(jax.random.key(s))) for s in seeds])
        hparams = list(hparams) if hparams else [{}] * self.size
        keys = list(hparams[0])
        # the same value in every run stays a Python value; those that differ are traced
        self.differing = tuple(k for k in keys if any(not _same(h[k], hparams[0][k]) for h in hparams))
        self.fixed = {k: hparams[0][k] for k in keys if k not in self.differing}
        self._values = {k: np.asarray([h[k] for h in hparams]) for k in self.differing}
        self._read: set[str] = set()  # the names the user's code read while traced
        # one run's batch (shapes, `Runs.build`), and whether each batch holds every run's rows
        # ([batch, runs, ...]: `RunOrders`)
        self.batch: Any = None
        self.per_run_data = False

    # ---------------------------------------------------------------- names of per-run values

    def slots(self, names: Mapping[str, Any]) -> dict[str, Any]:
        """Accumulator slots (`fitjax.metrics.zeros`' `names`) under each run's names."""
        return {name + run_suffix(i): slot for name, slot in names.items() for i in range(self.size)}

    def flat(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """`{name: tree with a leading runs axis}` as `{name/run_<i>: run i's tree}`."""
        return {name + run_suffix(i): jax.tree.map(lambda x, i=i: x[i], value)
                for name, value in values.items() for i in range(self.size)}

    def stacked(self, flat: Mapping[str, Any]) -> dict[str, Any]:
        """The inverse of `flat`."""
        names = dict.fromkeys(key.rpartition(_SUFFIX)[0] for key in flat)
        return {name: jax.tree.map(lambda *xs: jnp.stack(xs), *(flat[name + run_suffix(i)] for i in range(self.size)))
                for name in names}

    # ------------------------------------------------------------------ the traced functions

    def spec(self, spec: ModuleSpec) -> ModuleSpec:
        """`spec` whose optimizer is made anew in each traced function, under the run's
        hyperparameters: a learning rate read from `self.hparams` is then the run's (traced)."""
        make = spec.optimizer

        def made() -> optax.GradientTransformationExtraArgs:
            return optax.with_extra_args_support(check_optimizer(make(), spec.owner))

        def update(updates, state, params=None, **extra):
            return made().update(updates, state, params, **extra)

        tx = optax.GradientTransformationExtraArgs(lambda params: made().init(params), update)
        return dataclasses.replace(spec, optimizer=lambda: tx)

    def _member(self, fn: Callable, fixed: Mapping[str, Any]) -> Callable:
        """`fn(*args)` with the run's hyperparameters in `self.hparams`; `values` is one run's."""

        def member(values, *args):
            run = context.RunHparams({**fixed, **values}, self._read)
            with context.run_hparams(run):
                return fn(*args)

        return member

    def _vmapped(self, fn: Callable, in_axes: tuple, *args: Any, out_axes: Any = 0,
                 vmap: Callable[..., Callable] | None = None) -> Any:
        """`fn` of every run (`in_axes` of `args`), the differing hyperparameters traced. A
        hyperparameter used where JAX needs a Python value (a shape, an `if`) is refused, named.
        `vmap`: another than the platform's."""
        traced = {k: jnp.asarray(v) for k, v in self._values.items()}
        try:
            over_runs = (vmap or self._vmap)(self._member(fn, self.fixed), in_axes=(0, *in_axes), out_axes=out_axes)
            return over_runs(traced, *args)
        except TypeError as err:  # JAX's tracer errors, and fitjax's help that re-raises them (`explain_jit_rules`)
            jax_error = _tracer_error(err)
            if not self.differing or jax_error is None:
                raise
            culprits = [k for k in self.differing if self._fails_alone(k, fn, in_axes, args)] or list(self.differing)
            raise ValueError(self._python_value_message(culprits, jax_error)) from err

    def _fails_alone(self, key: str, fn: Callable, in_axes: tuple, args: tuple) -> bool:
        """Whether tracing with only `key` traced (the others at run 0's values) fails as above."""
        fixed = {**self.fixed, **{k: v[0].item() for k, v in self._values.items() if k != key}}
        try:
            self._vmap(self._member(fn, fixed), in_axes=(0, *in_axes))({key: jnp.asarray(self._values[key])}, *args)
        except TypeError as err:
            return _tracer_error(err) is not None
        return False

    def _python_value_message(self, culprits: Sequence[str], jax_error: BaseException) -> str:
        """Why a hyperparameter that differs between runs cannot be used where it was, and the fix."""
        names = " and ".join(f"hparams.{k}" for k in culprits)
        differs, is_ = ("differs", "is") if len(culprits) == 1 else ("differ", "are")
        first = culprits[0]
        return (
            f"Trainer(runs=[...]): {names} {differs} between runs and {is_} used as a Python value in "
            f"{self._used_at(jax_error)}: each run's {first!r} is a traced array there, and a Python `if`, "
            "`int()`/`float()`, a NumPy conversion, a shape (a layer's width) or a flax layer's field "
            "(`nn.Dropout(rate=...)` checks its rate in Python) needs one value for every run. Runs may "
            "differ only in values used as numbers in array math (a learning rate, a weight decay, a loss "
            f"weight, a dropout rate applied by hand: `x * jax.random.bernoulli(key, 1 - p, x.shape) / (1 - p)`); "
            f"otherwise fit one module per value of {first!r}. JAX said: {type(jax_error).__name__}: "
            f"{str(jax_error).splitlines()[0]}")

    def _used_at(self, jax_error: BaseException) -> str:
        """`"M.loss (line 17)"`: the module's method, and its line, that the error passed
        through last (the user's own code, not fitjax's); the module's name when none did."""
        found = self.owner
        for frame, line in traceback.walk_tb(jax_error.__traceback__):  # outermost first
            if (self._module_type is not None and isinstance(frame.f_locals.get("self"), self._module_type)
                    and not os.path.abspath(frame.f_code.co_filename).startswith(_FITJAX + os.sep)):
                found = f"{self.owner}.{frame.f_code.co_name} (line {line})"
        return found

    def init(self, init_fn: Callable[..., TrainState]) -> Callable[..., TrainState]:
        """`init(rng, batch, given)` of every run: run i from its own seed's key (`rng` unused);
        `given` variables are shared (every run starts from them)."""

        def runs_init(rng, batch, given):
            del rng
            keys = jax.random.wrap_key_data(jnp.asarray(self._key_data))
            # one run after another (`_one_by_one`): the init program is then one run's, compiled
            # in about one run's time (vmapped, the 8-run CNN's took twice as long), and runs once
            state = self._vmapped(init_fn, (0, None, None), keys, batch, given, out_axes=_STATE_AXES,
                                  vmap=_one_by_one)
            # which runs still train (an early-stopped run's updates are masked out)
            return state.replace(metrics=self.flat(state.metrics), extras={_ACTIVE: jnp.ones(self.size, bool)})

        return runs_init

    def step(self, step_fn: Callable, *, stacked: int = 0) -> Callable:
        """`train_step(state, inputs)` of every run, on the same inputs (or each run's rows of
        them); `stacked`: how many dimensions (steps, micro-batches) a call's batches and what
        the step returns for the hooks stack in front of the rows."""

        def runs_step(state, inputs):
            runs_state = state.replace(metrics=self.stacked(state.metrics), extras=None)
            new, values = self._vmapped(step_fn, (_STATE_AXES, self._inputs_axes(inputs)), runs_state, inputs,
                                        out_axes=(_STATE_AXES, 0))
            self._check_read()
            returned = values.pop(OUTPUTS_KEY, None)  # what the step returned for the hooks
            active = state.extras[_ACTIVE]

            def keep(new_tree, old_tree):  # a stopped run keeps its parameters and optimizer state
                return jax.tree.map(lambda n, o: jnp.where(active.reshape(-1, *[1] * (n.ndim - 1)), n, o),
                                    new_tree, old_tree)

            new = new.replace(params=keep(new.params, state.params), opt_state=keep(new.opt_state, state.opt_state),
                              model_state=keep(new.model_state, state.model_state), extras=state.extras)
            values = self.flat(values)
            if returned is not None:  # every run's rows on the axis after the batch's, behind [steps, micro-batches]
                values[OUTPUTS_KEY] = rows_then_runs(returned, stacked)
            return new.replace(metrics=self.flat(new.metrics)), values

        runs_step.__name__ = getattr(step_fn, "__name__", "train_step")
        return runs_step

    def _inputs_axes(self, inputs: Any) -> Any:
        """None (every run reads the same inputs), or where each leaf holds the runs: right
        after the batch's axis, behind the stacked steps and micro-batches (`(batches, mask)`
        with accumulation: the mask is shared)."""
        if not self.per_run_data:
            return None
        batches, mask = self._batches(inputs)
        axes = jax.tree.map(lambda x, one: x.ndim - one.ndim, batches, self.batch)
        return (axes, *mask) if mask else axes

    def _batches(self, inputs: Any) -> tuple[Any, tuple]:
        """The batches of a train step's inputs, and `(None,)` for a mask beside them (accumulation)."""
        if jax.tree.structure(inputs) == jax.tree.structure(self.batch):
            return inputs, ()
        return inputs[0], (None,)

    def eval_step(self, eval_fn: Callable) -> Callable:
        """`eval_step(params, model_state, rng, acc, batch, mask, index)` of every run, on the same batch."""

        def runs_eval(params, model_state, rng, acc, batch, mask, index):
            acc, values, *returned = self._vmapped(eval_fn, (0, 0, 0, 0, None, None, None), params, model_state, rng,
                                                   self.stacked(acc), batch, mask, index)
            # what the step returned and appended for the hooks: every run's rows on axis 1
            return (self.flat(acc), self.flat(values), *rows_then_runs(returned, 0))

        runs_eval.__name__ = getattr(eval_fn, "__name__", "eval_step")
        return runs_eval

    def predict_step(self, predict_fn: Callable) -> Callable:
        """`predict_step(params, model_state, rng, batch)` of every run, on the same batch: each
        leaf `[batch, runs, ...]` (every run's rows side by side; a scalar per run: `[runs]`)."""

        def runs_predict(params, model_state, rng, batch):
            return rows_then_runs(self._vmapped(predict_fn, (0, 0, 0, None), params, model_state, rng, batch), 0)

        runs_predict.__name__ = getattr(predict_fn, "__name__", "predict_step")
        return runs_predict

    def _check_read(self) -> None:
        """A hyperparameter that differs between runs but that no traced code read would leave
        every run the same: an error, once the train step (and the init) has been traced."""
        unread = [k for k in self.differing if k not in self._read]
        if unread:
            raise ValueError(
                f"Trainer(runs=[...]) gives {unread!r} a different value in each run, but {self.owner} "
                "never read it through `self.hparams` in `loss`, `metrics` or `configure_optimizer`: "
                "every run would train the same. A value used in `__init__` (the model's width, a "
                "layer's dropout rate) is fixed when the module is made; read it from `self.hparams` "
                "where the step uses it, or fit one module per value.")


def rows_then_runs(tree: Any, stacked: int) -> Any:
    """`tree`'s leaves `[runs, *stacked, batch, ...]` as `[*stacked, batch, runs, ...]`: the runs'
    axis after the rows (where the rows are trimmed and joined); a leaf without rows keeps it last."""
    return jax.tree.map(lambda x: jnp.moveaxis(x, 0, min(stacked + 1, x.ndim - 1)), tree)


def _tracer_error(err: BaseException) -> BaseException | None:
    """JAX's error of a traced value used where a Python value is needed (one of its tracer
    errors, or a plain `TypeError` naming a tracer: a shape), found in `err` or in what it was
    raised from (fitjax's help for the jit rules re-raises it as a `TypeError`); None for any
    other error."""
    chain = []
    while err is not None:
        chain.append(err)
        err = err.__cause__
    typed = [e for e in chain if isinstance(e, _TRACER_ERRORS)]
    # a shape from a tracer: "Shapes must be 1D sequences of concrete values ..., got (8, JitTracer(int32[]))"
    named = [e for e in chain if isinstance(e, TypeError) and ("Traced<" in str(e) or "Tracer(" in str(e)
                                                                or "concrete value" in str(e))]
    return (typed or named or [None])[0]


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(np.all(np.asarray(a) == np.asarray(b)))
    except Exception:  # noqa: BLE001 - values that cannot be compared are different
        return a is b
