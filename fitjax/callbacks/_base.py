"""`Callback`: plain objects with hook methods; the trainer calls them in a loop over a list.

Hooks receive the trainer and the module, with Lightning's names and arguments. What a callback
may read from the trainer (never its `_private` attributes):

- `trainer.progress`: the loop's position, read-only (`epoch`, `global_step`, `batches_done`,
  `batches_in_epoch`, `last_logged` / `last_validated` / `last_saved`), and `crossed(n)`: whether
  the last call of the train step passed a multiple of n steps (use it, not `global_step % n`:
  one call may run several steps). `trainer.global_step`, `trainer.current_epoch`,
  `trainer.num_training_batches` read the same object.
- `trainer.callback_metrics` (complete up to the last log step when read; reading it writes
  nothing to the loggers), `logged_metrics`, `progress_bar_metrics`; `trainer.state` (the
  `TrainState`), `trainer.loggers`; `trainer.stage` (what runs now: its name,
  `sanity_checking`, `verbose`; read-only) and `trainer.sanity_checking`.
- `trainer.is_global_zero`, `trainer.agree(flag)` (True everywhere when True on any process:
  for decisions from host-local facts such as time), `trainer.checkpoint_meta(module)` (the
  plain data a checkpoint stores besides the state, after the `on_save_checkpoint` hooks) and `trainer.record_save()` (a
  save of the current position happens: `progress.last_saved`), `trainer.received_sigterm`.
- A callback logs a value with `module.log(name, value)` (`module.log_dict`) in any hook, as
  Lightning's `pl_module.log`: it is in `trainer.callback_metrics` at once and reaches the
  loggers through the trainer's metric log, at the row of the step in progress (from the train
  batch hooks at log steps only). `trainer.callback_metrics` itself is read-only.
- A callback may set `trainer.should_stop = True` (Lightning's contract). A hook no callback overrides is never called: the
trainer asks `CallbackList.wants(name)` once per fit, so per-step hooks cost nothing unless used.
"""

from __future__ import annotations

from typing import Any, Callable

from fitjax._logged import collecting
from fitjax import module as module_lib
from fitjax.module import LitModule

__all__ = ["Callback", "CallbackList"]

HOOKS = (
    "setup", "teardown",
    "on_fit_start", "on_fit_end",
    "on_sanity_check_start", "on_sanity_check_end",
    "on_train_start", "on_train_end",
    "on_train_epoch_start", "on_train_epoch_end",
    "on_train_batch_start", "on_train_batch_end",
    "on_validation_start", "on_validation_end",
    "on_validation_epoch_start", "on_validation_epoch_end",
    "on_validation_batch_start", "on_validation_batch_end",
    "on_test_start", "on_test_end",
    "on_test_epoch_start", "on_test_epoch_end",
    "on_test_batch_start", "on_test_batch_end",
    "on_predict_start", "on_predict_end",
    "on_predict_epoch_start", "on_predict_epoch_end",
    "on_predict_batch_start", "on_predict_batch_end",
    "on_save_checkpoint", "on_load_checkpoint",
    "on_exception",
)  # fmt: skip


class Callback:
    """Base class for callbacks; override the hooks you need.

    Batch-end hooks receive `outputs`: what the step returned (`training_step`'s dict, the batch's
    real rows of `validation_step`'s) merged with the step's values, as device arrays (see
    docs/porting.md). Overriding one makes the steps return them; reading one
    (`float(outputs["loss"])`) waits for that step to finish — a host sync per batch that stalls
    the pipeline of queued steps; read them every N batches, or use the values the trainer
    fetches every `log_every_n_steps` in `trainer.callback_metrics` (reading it after a log step
    waits for that step's values if they are still on their way: once per log step).

    Example:
        >>> import fitjax as fj
        >>> class PrintEpoch(fj.Callback):
        ...     def on_train_epoch_end(self, trainer, module):
        ...         print(trainer.current_epoch, trainer.callback_metrics.get("train/loss_epoch"))
    """

    def setup(self, trainer, module, stage: str) -> None: ...
    def teardown(self, trainer, module, stage: str) -> None: ...
    def on_fit_start(self, trainer, module) -> None: ...
    def on_fit_end(self, trainer, module) -> None: ...
    def on_sanity_check_start(self, trainer, module) -> None: ...
    def on_sanity_check_end(self, trainer, module) -> None: ...
    def on_train_start(self, trainer, module) -> None: ...
    def on_train_end(self, trainer, module) -> None: ...
    def on_train_epoch_start(self, trainer, module) -> None: ...
    def on_train_epoch_end(self, trainer, module) -> None: ...
    def on_train_batch_start(self, trainer, module, batch: Any, batch_idx: int) -> None: ...
    def on_train_batch_end(self, trainer, module, outputs: Any, batch: Any, batch_idx: int) -> None: ...
    def on_validation_start(self, trainer, module) -> None: ...
    def on_validation_end(self, trainer, module) -> None: ...
    def on_validation_epoch_start(self, trainer, module) -> None: ...
    def on_validation_epoch_end(self, trainer, module) -> None: ...
    def on_validation_batch_start(self, trainer, module, batch: Any, batch_idx: int,
                                  dataloader_idx: int = 0) -> None: ...
    def on_validation_batch_end(self, trainer, module, outputs: Any, batch: Any, batch_idx: int,
                                dataloader_idx: int = 0) -> None: ...
    def on_test_start(self, trainer, module) -> None: ...
    def on_test_end(self, trainer, module) -> None: ...
    def on_test_epoch_start(self, trainer, module) -> None: ...
    def on_test_epoch_end(self, trainer, module) -> None: ...
    def on_test_batch_start(self, trainer, module, batch: Any, batch_idx: int,
                            dataloader_idx: int = 0) -> None: ...
    def on_test_batch_end(self, trainer, module, outputs: Any, batch: Any, batch_idx: int,
                          dataloader_idx: int = 0) -> None: ...
    def on_predict_start(self, trainer, module) -> None: ...
    def on_predict_end(self, trainer, module) -> None: ...
    def on_predict_epoch_start(self, trainer, module) -> None: ...
    def on_predict_epoch_end(self, trainer, module) -> None: ...
    def on_predict_batch_start(self, trainer, module, batch: Any, batch_idx: int) -> None: ...
    def on_predict_batch_end(self, trainer, module, outputs: Any, batch: Any, batch_idx: int) -> None: ...
    def on_exception(self, trainer, module, exception: BaseException) -> None: ...

    def on_save_checkpoint(self, trainer, module, checkpoint: dict[str, Any]) -> None:
        """Called when a checkpoint is saved, with its plain-data item (Lightning's hook).

        `checkpoint` is the JSON item saved beside the arrays (the loop position, `callbacks`
        with every `state_dict()`, `hparams`, ...); keys added to it are saved with it and
        handed back to `on_load_checkpoint` when a fit resumes from it. Values must be JSON
        data (numbers, strings, lists, dicts): the arrays of the run are the train state's,
        which Orbax saves. Callbacks are called in order, then the module's own hook.
        """

    def on_load_checkpoint(self, trainer, module, checkpoint: dict[str, Any]) -> None:
        """Called when a fit resumes from a checkpoint (or `validate/test/predict` load one),
        with the plain-data item `on_save_checkpoint` saw, before `load_state_dict` (Lightning's
        order: the module's hook first, then the callbacks')."""

    def step_pieces(self) -> tuple:
        """Pieces this callback adds around the jitted train step (`fitjax.step.pieces.StatePiece`).

        The trainer asks each callback once, when it is constructed, and builds its step with them:
        each piece's state is one entry of `TrainState.extras`, updated inside the step, sharded,
        checkpointed and resumed with the rest of the state (`fj.callbacks.EMA` and
        `fj.callbacks.StochasticWeightAveraging` are two).
        """
        return ()

    def state_dict(self) -> dict[str, Any]:
        """What to store in a checkpoint to resume this callback exactly."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores what `state_dict` returned."""

    @property
    def state_key(self) -> str:
        """The key of this callback's state in a checkpoint (class name by default)."""
        return type(self).__qualname__


def ignores_batch(hook):
    """Marks a per-batch hook that never reads its `batch`: with the data kept on the devices the
    trainer then skips gathering a host copy of each batch for it."""
    hook.ignores_batch = True
    return hook


def ignores_outputs(hook):
    """Marks a batch-end hook that never reads its `outputs`: when no other hook reads them,
    the step then does not return what `training_step` / `validation_step` returned."""
    hook.ignores_outputs = True
    return hook


def plain_hook(hook):
    """Marks a per-step hook that never logs (`module.log`) and never calls the module's model:
    when every hook of that name is so marked (and the module does not define it), the trainer
    calls them directly, without opening a logging block or installing the host model around
    each call (~15 µs a step for each hook on the tiny MLP: `benchmarks/host_profile.py`). A
    subclass that overrides the hook is called the full way unless it marks its own."""
    hook.plain_hook = True
    return hook


def _overrides(cb: Callback, hook: str) -> bool:
    # A hook set on the instance counts too (`LambdaCallback` keeps its functions there).
    return hook in getattr(cb, "__dict__", {}) or getattr(type(cb), hook) is not getattr(Callback, hook)


class CallbackList:
    """The one dispatcher of hooks: a hook runs on the module (when its class defines it) and on
    each callback that overrides it, each in a `collecting()` block, so what it passes to
    `module.log` reaches the trainer's metric log (the one road of logged values). The order is
    `fitjax.module.hook_table`'s: the module's no-argument lifecycle hooks first, its hooks with
    arguments after the callbacks' (Lightning's order). Which callbacks override a hook is
    decided once, here; which hooks a module class defines, once per class, so an undefined
    hook costs nothing per step."""

    def __init__(self, callbacks: list[Callback], *, profile: Callable[[str], Any] | None = None):
        self.callbacks = list(callbacks)
        self._overriding = {name: [cb for cb in self.callbacks if _overrides(cb, name)] for name in HOOKS}
        self._profile = profile  # action name -> context manager (a profiler's), or None: untimed
        self.response: Any = None  # what the module's last hook returned (on_train_batch_start's -1)
        self._defined: dict[type, frozenset[str]] = {}  # module class -> the hooks it defines

    def timed(self, profile: Callable[[str], Any]) -> CallbackList:
        """The same list, each hook timed as "[LitModule]<class>.<hook>" / "[Callback]<class>.<hook>"
        in `profile(name)` (a profiler's `profile`)."""
        return CallbackList(self.callbacks, profile=profile)

    def wants(self, hook: str, module: LitModule | None = None) -> bool:
        """True when some callback overrides `hook`, or `module` defines it (the trainer skips
        per-step work otherwise)."""
        return bool(self._overriding.get(hook)) or (module is not None and module_lib.overrides(module, hook))

    def overriding(self, hook: str) -> list[Callback]:
        """The callbacks that override `hook`, in call order (after the module's own hook)."""
        return self._overriding.get(hook, [])

    def plain_methods(self, hook: str, module: LitModule) -> list[Callable[..., Any]] | None:
        """The callbacks' bound `hook` methods when each is marked `plain_hook`, the module does
        not define `hook` and no profiler times the hooks (they can then be called directly, as
        `method(trainer, module, *args)`); else None."""
        if self._profile is not None or module_lib.overrides(module, hook):
            return None
        methods = [getattr(cb, hook) for cb in self._overriding.get(hook, ())]
        return methods if all(getattr(m, "plain_hook", False) for m in methods) else None

    def needs_batch(self, hook: str, module: LitModule | None = None) -> bool:
        """True when a callback overriding the per-batch `hook` may read its `batch` argument
        (all but those marked with `ignores_batch`, fitjax's own), or `module` defines it."""
        return (module is not None and module_lib.overrides(module, hook)) or any(
            not getattr(getattr(cb, hook), "ignores_batch", False) for cb in self._overriding[hook])

    def reads_outputs(self, hook: str, module: LitModule | None = None) -> bool:
        """True when a callback overriding the batch-end `hook` may read its `outputs` (all but
        those marked with `ignores_outputs`, fitjax's own), or `module` defines it."""
        return (module is not None and module_lib.overrides(module, hook)) or any(
            not getattr(getattr(cb, hook), "ignores_outputs", False) for cb in self._overriding[hook])

    def call(self, hook: str, trainer, module, *args: Any, log: Callable[..., None] | None = None) -> None:
        """Calls `hook`; what each hook (the module's, each callback's) passed to `module.log`
        goes to `log(logged, owner=<its class name>, hook=hook)` as soon as that hook returns, so
        the next one sees it in `trainer.callback_metrics` (the trainer's metric log's
        `log_hook`; None: dropped). What the module's hook returned is `self.response`."""
        # per step: builtins only on the path of a hook the module does not define
        # (tests/loop/test_host_cost.py counts the Python calls)
        defined = self._defined.get(type(module))
        if defined is None:
            defined = self._defined[type(module)] = frozenset(
                name for name in _MODULE_HOOKS if module_lib.overrides(module, name))
        self.response = None
        if hook in defined and hook in module_lib.hook_table.BEFORE_CALLBACKS:
            self.response = self._run(module, hook, args, log)
        for cb in self._overriding.get(hook, ()):
            self._run(cb, hook, (trainer, module, *args), log)
        if hook in defined and hook not in module_lib.hook_table.BEFORE_CALLBACKS:
            self.response = self._run(module, hook, args, log)

    def _run(self, owner: Any, hook: str, args: tuple, log: Callable[..., None] | None) -> Any:
        with collecting(host=True) as logged:
            if self._profile is None:
                response = getattr(owner, hook)(*args)
            else:
                kind = "LitModule" if isinstance(owner, LitModule) else "Callback"
                with self._profile(f"[{kind}]{type(owner).__name__}.{hook}"):
                    response = getattr(owner, hook)(*args)
        if logged.values and log is not None:
            log(logged, owner=type(owner).__name__, hook=hook)
        return response


# The module hooks the list runs (`setup`, the data and checkpoint hooks have their own places).
_MODULE_HOOKS = (module_lib.hook_table.BEFORE_CALLBACKS | module_lib.hook_table.AFTER_CALLBACKS
                 | module_lib.hook_table.MODULE_ONLY)
