"""The model as host code sees it: `self(z)` or `self.model(z)` in `on_train_epoch_end`, a
callback's `pl_module(x)`, or `module(x)` after fit, run with the current weights.

Outside the jitted step a flax Linen module holds no weights (calling it raises "only
accessible from inside 'init' or 'apply'"), and an NNX model's own weights are written back only
when fit ends. While a host hook runs, the trainer puts a `HostModel` where the module keeps its
flax model: calling it (or one of its methods or submodules, `self.model.decode(z)`,
`self.model.generator(z)`) applies the flax model to the arguments with the weights the trainer
holds now, in train or eval mode as `module.training` says (Lightning's `self.training`: True in
fit's train hooks, False in validation, test and predict).

Each call runs one jitted function, compiled once per method, mode, argument shapes and
non-array arguments (Python numbers, flags), which are static. What the call would update
(BatchNorm's running statistics in train mode) is dropped: host calls never change the weights.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator

import flax.linen as nn
import jax
import numpy as np
from flax import nnx

from fitjax.strategies import fetched

__all__ = ["HostModel", "installed", "unwrap"]

_HOST_RNG_SALT = 0x4057  # train-mode host calls draw dropout keys apart from the steps'

Variables = Callable[[], "tuple[Any, Any, jax.Array] | None"]


def unwrap(model: Any) -> Any:
    """The flax model behind a `HostModel` (the model itself otherwise)."""
    return model._model if isinstance(model, HostModel) else model


class HostModel:
    """A flax model bound to the trainer's current weights for host code (see the module doc)."""

    def __init__(self, module: Any, model: Any, variables: Variables, path: tuple[str, ...] = (),
                 cache: dict | None = None, root: tuple[str, ...] = ()):
        self._module, self._model, self._variables, self._path = module, model, variables, path
        self._root = root  # the model's own path: (name,) for one of several models (`self.net`)
        self._cache = {} if cache is None else cache  # shared by the submodules' views

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        variables = self._variables()
        if variables is None:
            where = ".".join((type(self._module).__name__, *(() if self._root else ("model",)), *self._path))
            raise RuntimeError(
                f"{where}(...) was called from host code before the model has weights: they exist "
                "once fit (or validate/test/predict) has built the model from its first batch, i.e. "
                "from `on_fit_start` on, and after fit. Call it from a later hook."
            )
        params, model_state, rng = variables
        leaves, treedef = jax.tree.flatten((args, kwargs))
        dynamic = [isinstance(leaf, (jax.Array, np.ndarray)) for leaf in leaves]
        static = tuple(None if d else leaf for leaf, d in zip(leaves, dynamic))
        training = bool(self._module.training)
        key = (self._path, training, treedef, tuple(dynamic), static)
        if key not in self._cache:
            self._cache[key] = self._compile(training, treedef, dynamic, static)
        arrays = [leaf for leaf, d in zip(leaves, dynamic) if d]
        return self._cache[key](params, model_state, rng, arrays)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        target = self._model
        try:
            value = getattr(target, name) if self._path == self._root else None
        except AttributeError:  # a Linen submodule made in `setup`: it exists inside `apply` only
            value = None
        if value is not None and not callable(value) and not isinstance(value, (nn.Module, nnx.Module)):
            return value  # a field (`self.model.latent`)
        return HostModel(self._module, self._model, self._variables, (*self._path, name), self._cache, self._root)

    def __repr__(self) -> str:
        return f"HostModel({'.'.join(('model', *self._path))} of {type(self._model).__name__})"

    def _compile(self, training: bool, treedef, dynamic: list[bool], static: tuple) -> Callable:
        binding, path = self._module._get_binding(), self._path

        def call(model, arrays):
            it = iter(arrays)
            leaves = [next(it) if d else s for d, s in zip(dynamic, static)]
            args, kwargs = jax.tree.unflatten(treedef, leaves)
            return functools.reduce(getattr, path, model)(*args, **kwargs)

        def host_call(params, model_state, rng, arrays):
            # a fit's state kept in host memory (`Trainer(offload=...)`) is read on the device
            params, model_state = fetched((params, model_state))
            rng = jax.random.fold_in(rng, _HOST_RNG_SALT)
            with hook_mode(self._module, training):
                out, _ = binding.apply(call, params, model_state, rng, arrays, train=training)
            return out

        # raw `jax.jit`: a host call of the model (a hook, a notebook) has no strategy; it runs where
        # its arrays are, outside any fit's mesh
        return jax.jit(host_call)


@contextlib.contextmanager
def hook_mode(module: Any, training: bool) -> Iterator[None]:
    """Lightning's `train()`/`eval()` around host code: `module.training` is `training` inside (the
    mode a host call of the model runs in)."""
    previous, module.training = module.training, training
    try:
        yield
    finally:
        module.training = previous


@contextlib.contextmanager
def installed(module: Any, variables: Variables) -> Iterator[None]:
    """Inside the block the module's flax model attributes are `HostModel`s over `variables()`
    (one of several models is called by its name: `self.target_net(x)`)."""
    names = module._model_attribute_names()
    models = []
    for name in names:  # a loop, not a comprehension: this runs at every hook call (host cost)
        model = vars(module)[name]
        if not isinstance(model, HostModel):
            models.append((name, model))
    if not models:
        yield
        return
    cache = module.__dict__.setdefault("_host_model_cache", {})
    several = len(names) > 1  # one of several models is reached by its name: `self.target_net(x)`
    for name, model in models:
        root = (name,) if several else ()
        setattr(module, name, HostModel(module, model, variables, root, cache, root))
    try:
        yield
    finally:
        for name, model in models:
            setattr(module, name, model)
