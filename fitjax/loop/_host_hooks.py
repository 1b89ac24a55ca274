"""The loop's one way to call a hook: on the module and the callbacks (`CallbackList.call`), with
the hooks' view of the model installed, and what they passed to `module.log` handed to the
metric log; and `with_transfer_hooks`, Lightning's batch transfer hooks on each host batch.

While a hook of the module or a callback runs, the module's flax model is a
`fitjax.module._host_model.HostModel` over the weights the trainer holds now, so `self(z)` in
`on_train_epoch_end` or `pl_module(x)` in a callback runs as in Lightning. Installing it costs two
attribute writes per hook call; nothing is compiled or read until host code calls the model.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import numpy as np

from fitjax import module as module_lib
from fitjax.module import host_model_installed

__all__ = ["HostHooks", "edited_params", "with_transfer_hooks"]

_TRANSFER_HOOKS = ("on_before_batch_transfer", "on_after_batch_transfer")


class HostHooks:
    """Stands in for the loop's callback list: each `call` runs with the host model installed,
    and what the hooks logged goes to `log` (`MetricLog.log_hook`), unless `muted()` (the
    sanity check: nothing is logged, as in Lightning)."""

    def __init__(self, hooks: Any, variables: Callable[[Any], Any], log: Callable[..., None],
                 muted: Callable[[], bool]) -> None:
        self._hooks = hooks
        self._variables = variables  # module -> (params, model_state, rng) now, or None
        self._log = log
        self._muted = muted

    def __getattr__(self, name: str) -> Any:
        return getattr(self._hooks, name)

    def wrapped(self, wrap: Callable[[Any], Any]) -> "HostHooks":
        """The same, around `wrap(the list)` (a profiler's timed hooks)."""
        return HostHooks(wrap(self._hooks), self._variables, self._log, self._muted)

    def call(self, hook: str, trainer, module, *args: Any) -> None:
        with host_model_installed(module, lambda: self._variables(module)):
            self._hooks.call(hook, trainer, module, *args, log=None if self._muted() else self._log)

    def caller(self, hook: str, trainer, module) -> Callable[..., None]:
        """`call(hook, trainer, module, *args)` as a function of `args`, for a hook called at every
        step: when only callbacks' hooks marked `plain_hook` run (no logging block, no host model
        needed: fitjax's progress bar), the bound method itself, or a loop over them, one
        function call a hook instead of ~15 (`tests/loop/test_host_cost.py` counts them). The
        module does not define `hook` then: `response` (what its hook returned) is not set."""
        methods = self._hooks.plain_methods(hook, module)
        if methods is None:
            return functools.partial(self.call, hook, trainer, module)
        if len(methods) == 1:
            return functools.partial(methods[0], trainer, module)

        def call_plain(*args: Any) -> None:
            for method in methods:
                method(trainer, module, *args)

        return call_plain


def with_transfer_hooks(loader: Any, module: Any, dataloader_idx: int = 0) -> Any:
    """`loader` whose batches pass through the module's `on_before_batch_transfer(batch,
    dataloader_idx)` and then `on_after_batch_transfer(batch, dataloader_idx)` as they are drawn
    (the loader itself when the module defines neither).

    Both run on the host batch: fitjax moves it to the devices in the jitted step's call, so
    "after" the transfer is the same host batch (Lightning's GPU augmentation belongs in `loss`).
    The batches are drawn, and the hooks called, as the loop asks for them: the first train
    batch when fit builds the step (before `on_fit_start`), then each ahead of its
    `on_train_batch_start`. Data with hooks is never kept on the devices (each batch must pass
    through them)."""
    defined = [hook for hook in _TRANSFER_HOOKS if module_lib.overrides(module, hook)]
    if not defined:
        return loader
    return _Transferred(loader, [getattr(module, hook) for hook in defined], dataloader_idx)


class _Transferred:
    """A loader's batches through the transfer hooks; everything else (its length, `set_epoch`,
    `state_dict`) is the loader's."""

    def __init__(self, loader: Any, hooks: list[Callable[[Any, int], Any]], dataloader_idx: int) -> None:
        self._loader = loader
        self._hooks = hooks
        self._dataloader_idx = dataloader_idx

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)

    def __len__(self) -> int:
        return len(self._loader)

    def __iter__(self):
        for batch in self._loader:
            for hook in self._hooks:
                batch = hook(batch, self._dataloader_idx)
            yield batch


def edited_params(params: Any, edits: list[Callable[[Any], Any]], owner: str) -> Any:
    """`params` after the module's `update_params` functions, in order: checked to keep the
    tree's structure, shapes and dtypes, and placed with the old arrays' shardings as fresh
    buffers (the step donates its state: an array shared by two leaves, or with the caller,
    could not be donated)."""
    for fn in edits:
        new = fn(params)
        if jax.tree.structure(new) != jax.tree.structure(params):
            raise ValueError(f"{owner}.update_params: the function must return a tree shaped as the "
                             f"parameters it got; got {jax.tree.structure(new)}, expected "
                             f"{jax.tree.structure(params)}.")
        paths = [jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_leaves_with_path(params)]
        for path, a, b in zip(paths, jax.tree.leaves(new), jax.tree.leaves(params)):
            if (np.shape(a), jax.numpy.result_type(a)) != (b.shape, b.dtype):
                raise ValueError(f"{owner}.update_params: the new {path} is {np.shape(a)} "
                                 f"{jax.numpy.result_type(a)}, the parameter is {b.shape} {b.dtype}; "
                                 "return arrays of the parameters' shapes and dtypes.")
        params = jax.tree.map(lambda a, b: jax.device_put(a, b.sharding, may_alias=False), new, params)
    return params
