"""One interface over Linen and NNX models: initialise, then call a function of the bound model.

Both backends reduce a model to two plain pytrees of arrays: `params` (what the optimizer
updates) and `model_state` (BatchNorm statistics, NNX rng counters, ...). Everything the trainer
jits, shards and checkpoints is built from these two trees, so the rest of fitjax never asks which
kind of model it holds.
"""

from __future__ import annotations

import abc
import contextlib
import contextvars
from collections.abc import Iterator, Mapping
from typing import Any, Callable

import flax.linen as nn
import jax
import numpy as np
from flax import nnx

from fitjax._typing import PyTree

# Linen collections that are outputs of a call, not state to thread between steps.
_TRANSIENT_COLLECTIONS = ("intermediates",)


class ModelBinding(abc.ABC):
    """Initialises a model and calls `fn(bound_model, *args)` on given params and state."""

    #: The arrays' paths (collection left out) in the model's own order; known after `init`.
    order: tuple[tuple[str, ...], ...] = ()
    #: Flax sharding annotations, `{("params", *path): names per dimension}`; known after `init`.
    annotations: dict[tuple[str, ...], tuple] = {}

    @abc.abstractmethod
    def init(self, fn: Callable, rng: jax.Array, *args: Any) -> tuple[PyTree, PyTree]:
        """Returns `(params, model_state)`; traceable (it runs under `jax.jit`)."""

    @abc.abstractmethod
    def apply(
        self, fn: Callable, params: PyTree, model_state: PyTree, rng: jax.Array, *args: Any, train: bool
    ) -> tuple[Any, PyTree]:
        """Returns `(fn(bound_model, *args), new_model_state)`."""

    def initial_variables(self) -> tuple[PyTree, PyTree] | None:
        """The variables the model already holds (NNX), or None when it must be initialised."""
        return None


class LinenBinding(ModelBinding):
    """A `flax.linen.Module`: variables are created by tracing `fn` itself on the first batch."""

    def __init__(self, model: nn.Module, rng_streams: tuple[str, ...]):
        self.model = model
        self.rng_streams = tuple(rng_streams)

    def _rngs(self, rng: jax.Array) -> dict[str, jax.Array]:
        return {name: jax.random.fold_in(rng, i) for i, name in enumerate(self.rng_streams)}

    def init(self, fn, rng, *args):
        params_rng, rng = jax.random.split(rng)
        variables = nn.init(fn, self.model)({"params": params_rng, **self._rngs(rng)}, *args)
        # Static metadata, recorded while tracing; the strategy reads it, the arrays go unboxed.
        # The variables' order is the order the layers created them (jit's output sorts the keys).
        self.order = tuple(dict.fromkeys(path[1:] for path in _paths_in_order(variables)))
        self.annotations, variables = _unbox_linen(variables)
        params = variables.pop("params", {})
        state = {k: v for k, v in variables.items() if k not in _TRANSIENT_COLLECTIONS}
        return params, state

    def apply(self, fn, params, model_state, rng, *args, train):
        variables = {"params": params, **model_state}
        if train and model_state:
            out, updates = nn.apply(fn, self.model, mutable=list(model_state))(
                variables, *args, rngs=self._rngs(rng)
            )
            return out, {**model_state, **{k: updates[k] for k in model_state if k in updates}}
        return nn.apply(fn, self.model)(variables, *args, rngs=self._rngs(rng)), model_state


class NNXBinding(ModelBinding):
    """A `flax.nnx.Module`: split once into a graph and two pure-dict states, merged in the step.

    The states are kept as plain nested dicts of arrays (not `nnx.State` of Variables) so that
    they move through `jax.grad`, donation and Orbax like any pytree.
    """

    def __init__(self, model: nnx.Module):
        self.model = model
        self.graphdef, params, rest = nnx.split(model, nnx.Param, ...)
        self.order = tuple(_nnx_paths_in_order(model))  # NNX's states sort the attributes
        self.annotations = {**_nnx_annotations("params", params), **_nnx_annotations("model_state", rest)}
        self._initial = (nnx.to_pure_dict(params), nnx.to_pure_dict(rest))

    def initial_variables(self):
        return self._initial

    def init(self, fn, rng, *args):
        return self._initial

    def apply(self, fn, params, model_state, rng, *args, train):
        model = nnx.merge(self.graphdef, nnx.State(params), nnx.State(model_state))
        if train:
            model.train()
        else:
            model.eval()
        with _step_key(rng), _refusing_fixed_rngs():
            out = fn(model, *args)
        _, _, rest = nnx.split(model, nnx.Param, ...)
        return out, nnx.to_pure_dict(rest)

    def update_model(self, params: PyTree, model_state: PyTree) -> None:
        """Writes trained values back into the user's NNX module object."""
        _, param_state, rest_state = nnx.split(self.model, nnx.Param, ...)
        nnx.replace_by_pure_dict(param_state, params)
        nnx.replace_by_pure_dict(rest_state, model_state)
        nnx.update(self.model, param_state, rest_state)


class Models(Mapping):
    """Several flax models of one module, bound: `models.net(x)` or `models["net"](x)`.

    What `loss(self, model, batch)` gets as `model` when a module holds several flax models
    (`self.net` and `self.target_net`, `self.generator` and `self.discriminator`); inside the
    traced step the module's own attributes are these bound models too."""

    def __init__(self, models: dict[str, Any]):
        self.__dict__["_models"] = dict(models)

    def __getattr__(self, name: str) -> Any:
        try:
            return self._models[name]
        except KeyError:
            raise AttributeError(f"no model named {name!r}; the module's models are {sorted(self._models)}") from None

    def __getitem__(self, name: str) -> Any:
        return self._models[name]

    def __iter__(self):
        return iter(self._models)

    def __len__(self) -> int:
        return len(self._models)


class ModelsBinding(ModelBinding):
    """Several models, each bound by its own binding: `params` and `model_state` are dicts keyed
    by the models' names (the module's attribute names), so each is a top-level parameter group
    (`configure_optimizers` may return `{name: tx}`; manual optimization `{name: loss}`). `fn`
    gets a `Models` of the bound models; each draws from its own fold of the step's key."""

    def __init__(self, bindings: dict[str, ModelBinding]):
        self.bindings = dict(bindings)
        self.model = Models({name: b.model for name, b in self.bindings.items()})
        self._gather_static()

    def _gather_static(self) -> None:
        self.order = tuple((name, *path) for name, b in self.bindings.items() for path in b.order)
        self.annotations = {(root, name, *path): names for name, b in self.bindings.items()
                            for (root, *path), names in b.annotations.items()}

    def initial_variables(self):
        initial = {name: b.initial_variables() for name, b in self.bindings.items()}
        if any(v is None for v in initial.values()):
            return None
        return {n: v[0] for n, v in initial.items()}, {n: v[1] for n, v in initial.items()}

    def init(self, fn, rng, *args):
        names, variables = list(self.bindings), {}

        def nest(i: int, bound: dict[str, Any]) -> Any:
            if i == len(names):
                return fn(Models(bound), *args)
            name, binding, key = names[i], self.bindings[names[i]], jax.random.fold_in(rng, i)
            inner = lambda m: nest(i + 1, {**bound, name: m})  # noqa: E731
            held = binding.initial_variables()
            if held is None:
                variables[name] = binding.init(inner, key)
            else:  # an NNX model holds its variables: bound (not initialised) around the others' init
                variables[name] = held
                binding.apply(inner, *held, key, train=True)
            return None

        nest(0, {})
        self._gather_static()
        return {n: variables[n][0] for n in names}, {n: variables[n][1] for n in names}

    def apply(self, fn, params, model_state, rng, *args, train):
        names, states = list(self.bindings), {}

        def nest(i: int, bound: dict[str, Any]) -> Any:
            if i == len(names):
                return fn(Models(bound), *args)
            name = names[i]
            out, states[name] = self.bindings[name].apply(
                lambda m: nest(i + 1, {**bound, name: m}), params[name], model_state[name],
                jax.random.fold_in(rng, i), train=train)
            return out

        return nest(0, {}), states

    def update_model(self, params: PyTree, model_state: PyTree) -> None:
        """Writes trained values back into each NNX model object."""
        for name, binding in self.bindings.items():
            if isinstance(binding, NNXBinding):
                binding.update_model(params[name], model_state[name])


# The step's key (already folded with the step) while an NNX model's step code is traced: what
# `LitModule.step_rngs()` builds its `nnx.Rngs` from.
_STEP_KEY: contextvars.ContextVar[jax.Array | None] = contextvars.ContextVar("fitjax_step_key", default=None)


@contextlib.contextmanager
def _step_key(rng: jax.Array) -> Iterator[None]:
    token = _STEP_KEY.set(rng)
    try:
        yield
    finally:
        _STEP_KEY.reset(token)


def step_rngs(rng_streams: tuple[str, ...], owner: str) -> nnx.Rngs:
    """An `nnx.Rngs` with one stream per name of `rng_streams`, drawn from the step's key (folded
    with the step, as Linen's streams are): new keys every step, the same ones on a resume."""
    rng = _STEP_KEY.get()
    if rng is None:
        raise RuntimeError(
            f"{owner}.step_rngs() gives the keys of the step being traced: call it inside `loss`, "
            "`training_step` or another traced hook of a module whose model is an NNX model, and pass "
            "it to the model (`model(x, rngs=self.step_rngs())`).")
    return nnx.Rngs(**{name: jax.random.fold_in(rng, i) for i, name in enumerate(rng_streams)})


_FIXED_RNGS_ERROR = (
    "`nnx.Rngs({seeds})` was made inside the traced step with a fixed seed: the step is compiled "
    "once, so it would draw the same keys, e.g. the same dropout mask, at every step. Use the step's "
    "keys instead: `model(x, rngs=self.step_rngs())` (new keys each step, resumed exactly), or give "
    "the model its own `nnx.Rngs` in `__init__` (its counters are part of the model state).")


@contextlib.contextmanager
def _refusing_fixed_rngs() -> Iterator[None]:
    """While an NNX model's step code is traced, an `nnx.Rngs` made from fixed seeds (Python
    ints or concrete keys, not the traced step key) raises, saying what to use instead. Costs
    nothing per step: it runs only while the step is traced."""
    original = nnx.Rngs.__init__

    def checked(self, default=None, /, **streams):
        given = dict(default) if isinstance(default, Mapping) else {"default": default}
        fixed = [seed for seed in (*given.values(), *streams.values()) if _is_fixed_seed(seed)]
        if fixed:
            raise TypeError(_FIXED_RNGS_ERROR.format(seeds=", ".join(map(repr, fixed))))
        original(self, default, **streams)

    nnx.Rngs.__init__ = checked
    try:
        yield
    finally:
        nnx.Rngs.__init__ = original


def _is_fixed_seed(seed: Any) -> bool:
    """A Python int or a concrete key: the same value every time a compiled step runs."""
    if isinstance(seed, jax.core.Tracer) or seed is None or isinstance(seed, nnx.RngStream):
        return False
    return isinstance(seed, (int, np.integer, np.ndarray, jax.Array))


def _paths_in_order(tree: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """The key paths of a nested dict's leaves, in the dicts' own order."""
    for key, value in tree.items():
        if isinstance(value, Mapping):
            yield from _paths_in_order(value, (*path, str(key)))
        else:
            yield (*path, str(key))


def _nnx_paths_in_order(node: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """An NNX model's variables' paths in the order its attributes were set."""
    if isinstance(node, nnx.Variable):
        yield path
    elif isinstance(node, (nnx.Module, Mapping)):
        items = vars(node).items() if isinstance(node, nnx.Module) else node.items()
        for key, value in items:
            if not str(key).startswith("_"):
                yield from _nnx_paths_in_order(value, (*path, str(key)))
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            yield from _nnx_paths_in_order(value, (*path, str(i)))


def _unbox_linen(variables) -> tuple[dict[tuple[str, ...], tuple], dict]:
    """Linen `nn.Partitioned` boxes -> (their axis names by path, the plain arrays)."""
    is_box = lambda x: isinstance(x, nn.meta.AxisMetadata)  # noqa: E731
    annotations = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(variables, is_leaf=is_box)[0]:
        if isinstance(leaf, nn.Partitioned):
            names = tuple(str(getattr(e, "key", e)) for e in path)
            where = names[1:] if names[0] == "params" else names
            annotations[("params" if names[0] == "params" else "model_state", *where)] = tuple(leaf.names)
    # apply_constraint=False: no mesh is in context here; the strategy's out_shardings place them
    unboxed = jax.tree.map(
        lambda x: x.unbox(apply_constraint=False) if isinstance(x, nn.Partitioned) else (
            x.unbox() if is_box(x) else x), dict(variables), is_leaf=is_box)
    return annotations, unboxed


def _nnx_annotations(root: str, state: nnx.State) -> dict[tuple[str, ...], tuple]:
    """NNX Variables' sharding metadata (`sharding` / `out_sharding` / `sharding_names`) by path."""
    found = {}
    for path, var in nnx.to_flat_state(state):
        meta = var.get_metadata()
        names = next((meta[k] for k in ("out_sharding", "sharding_names", "sharding") if meta.get(k)), None)
        if names is not None and not isinstance(names, jax.sharding.Sharding):
            found[(root, *map(str, path))] = tuple(names)
    return found


def bind(model: Any, *, rng_streams: tuple[str, ...], owner: str) -> ModelBinding:
    """The binding for `model` (a `Models` of several: one binding each), with an error naming
    what was found when it is no flax model."""
    if isinstance(model, Models):
        return ModelsBinding({name: bind(m, rng_streams=rng_streams, owner=owner) for name, m in model.items()})
    if isinstance(model, nn.Module):
        return LinenBinding(model, rng_streams)
    if isinstance(model, nnx.Module):
        return NNXBinding(model)
    raise TypeError(
        f"{owner}.model must be a flax.linen.Module or a flax.nnx.Module, got {type(model).__name__}: "
        f"{model!r}. Assign your network in __init__: `self.model = MyNet()`."
    )
