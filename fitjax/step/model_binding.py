"""One interface over Linen and NNX models: initialise, then call a function of the bound model.

Both backends reduce a model to two plain pytrees of arrays: `params` (what the optimizer
updates) and `model_state` (BatchNorm statistics, NNX rng counters, ...). Everything the trainer
jits, shards and checkpoints is built from these two trees, so the rest of fitjax never asks which
kind of model it holds.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Mapping
from typing import Any, Callable

import flax.linen as nn
import jax
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
        out = fn(model, *args)
        _, _, rest = nnx.split(model, nnx.Param, ...)
        return out, nnx.to_pure_dict(rest)

    def update_model(self, params: PyTree, model_state: PyTree) -> None:
        """Writes trained values back into the user's NNX module object."""
        _, param_state, rest_state = nnx.split(self.model, nnx.Param, ...)
        nnx.replace_by_pure_dict(param_state, params)
        nnx.replace_by_pure_dict(rest_state, model_state)
        nnx.update(self.model, param_state, rest_state)


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
    """The binding for `model`, with an error naming what was found when it is no flax model."""
    if isinstance(model, nn.Module):
        return LinenBinding(model, rng_streams)
    if isinstance(model, nnx.Module):
        return NNXBinding(model)
    raise TypeError(
        f"{owner}.model must be a flax.linen.Module or a flax.nnx.Module, got {type(model).__name__}: "
        f"{model!r}. Assign your network in __init__: `self.model = MyNet()`."
    )
