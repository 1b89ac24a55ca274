"""The loop's one way to call a hook: on the module and the callbacks (`CallbackList.call`), with
the hooks' view of the model installed, and what they passed to `module.log` handed to the
metric log.

While a hook of the module or a callback runs, the module's flax model is a
`fitjax.module._host_model.HostModel` over the weights the trainer holds now, so `self(z)` in
`on_train_epoch_end` or `pl_module(x)` in a callback runs as in Lightning. Installing it costs two
attribute writes per hook call; nothing is compiled or read until host code calls the model.
"""

from __future__ import annotations

from typing import Any, Callable

from fitjax.module import host_model_installed

__all__ = ["HostHooks"]


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
