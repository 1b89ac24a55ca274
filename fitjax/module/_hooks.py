"""Every hook of Lightning 2.6's `LightningModule` (its `ModelHooks`, `DataHooks`,
`CheckpointHooks` and its own step and optimizer hooks), and what fitjax does with each one a
`LitModule` defines. Nothing a module defines is ignored: a hook is

- called on the host at Lightning's moment with Lightning's arguments (`HOST_HOOKS`),
- the traced step's code, run inside the jitted step (`TRACED_HOOKS`), or
- refused when a stage starts (`REFUSED_HOOKS`: why, and what to write instead), because it acts
  on something a JAX step does not have (a torch optimizer, `.grad` tensors, a device copy).

The loop asks `overrides(module, hook)` once per stage and calls only the hooks a module defines,
so a hook nobody defines costs nothing per step. docs/porting.md has the same table in words.
"""

from __future__ import annotations

from typing import Any

__all__ = ["AFTER_CALLBACKS", "BEFORE_CALLBACKS", "HOST_HOOKS", "MODULE_ONLY",
           "REFUSED_HOOKS", "TRACED_HOOKS", "check_hooks"]

# No-argument lifecycle hooks: the module's runs before the callbacks' of the same name, so what
# it logs (`self.log` in `on_validation_epoch_end`) is in `callback_metrics` when ModelCheckpoint
# and EarlyStopping read them.
BEFORE_CALLBACKS = frozenset({
    "on_fit_start", "on_fit_end", "on_train_start", "on_train_end",
    "on_train_epoch_start", "on_train_epoch_end",
    "on_validation_start", "on_validation_end", "on_validation_epoch_start", "on_validation_epoch_end",
    "on_test_start", "on_test_end", "on_test_epoch_start", "on_test_epoch_end",
    "on_predict_start", "on_predict_end", "on_predict_epoch_start", "on_predict_epoch_end",
})  # fmt: skip

# Hooks with arguments: the module's runs after the callbacks' (Lightning's order), with the
# arguments the callbacks get after `(trainer, module)`.
AFTER_CALLBACKS = frozenset({
    "on_train_batch_start", "on_train_batch_end",
    "on_validation_batch_start", "on_validation_batch_end",
    "on_test_batch_start", "on_test_batch_end",
    "on_predict_batch_start", "on_predict_batch_end",
    "teardown",
})  # fmt: skip

# Hooks only a module has (Lightning's switch of the torch module's mode around evaluation):
# called at Lightning's moment for what they do besides; fitjax's own eval mode is `self.training`.
MODULE_ONLY = frozenset({
    "on_validation_model_eval", "on_validation_model_train", "on_validation_model_zero_grad",
    "on_test_model_eval", "on_test_model_train", "on_predict_model_eval",
})  # fmt: skip

# Called on the host where fit/validate/test/predict ask for data and build the model.
_DATA_HOOKS = {
    "prepare_data": "before `setup`, when a stage starts",
    "setup": "setup(stage), before the stage's loaders are asked for",
    "configure_model": "after `setup`, before the model is built (once per stage; make it idempotent)",
    "configure_sharded_model": "as `configure_model` (Lightning's deprecated name)",
    "train_dataloader": "when fit starts (it needs the first batch to build the step)",
    "val_dataloader": "when fit (or validate) starts",
    "test_dataloader": "when test starts",
    "predict_dataloader": "when predict starts",
    "on_before_batch_transfer": "on each host batch as the loader yields it, (batch, dataloader_idx) -> batch",
    "on_after_batch_transfer": "right after `on_before_batch_transfer`, on the host batch (fitjax places "
                               "batches on the devices inside the jitted step's call)",
    "on_save_checkpoint": "with the checkpoint's plain-data item, after the callbacks'",
    "on_load_checkpoint": "when a checkpoint is loaded, before the callbacks'",
}

HOST_HOOKS: dict[str, str] = {
    **{hook: "at Lightning's moment, before the callbacks' hook" for hook in BEFORE_CALLBACKS},
    **{hook: "at Lightning's moment, after the callbacks' hook, with Lightning's arguments"
       for hook in AFTER_CALLBACKS},
    **{hook: "at Lightning's moment (fitjax's eval mode is `self.training`)" for hook in MODULE_ONLY},
    **_DATA_HOOKS,
}

TRACED_HOOKS: dict[str, str] = {
    "training_step": "traced once per shape inside the jitted train step; the returned loss is differentiated",
    "validation_step": "traced inside the jitted evaluation step",
    "test_step": "traced inside the jitted evaluation step",
    "predict_step": "traced inside the jitted predict step",
    "forward": "`self(x)`: the bound model inside traced hooks, the current weights in host hooks",
    "configure_optimizers": "called once when the step is built; returns optax transformations",
}

_GRADIENTS = ("the gradients exist only inside the jitted step, as a tree, not as `.grad` tensors "
              "a hook could read or edit between calls")
REFUSED_HOOKS: dict[str, str] = {
    "on_before_backward": f"{_GRADIENTS}. Log the loss or anything computed from it with "
                          "`self.log(...)` inside `training_step`/`loss`",
    "on_after_backward": f"{_GRADIENTS}. For the gradient norm use `Trainer(log_grad_norm=True)`; to "
                         "change gradients put an optax transformation first in `configure_optimizer`: "
                         "`optax.chain(my_transform, optax.adamw(...))`",
    "on_before_optimizer_step": f"{_GRADIENTS}. For the gradient norm use `Trainer(log_grad_norm=True)`; "
                                "clipping is `Trainer(gradient_clip_val=...)`; other edits are an optax "
                                "transformation first in the chain `configure_optimizer` returns",
    "on_before_zero_grad": "gradients are never accumulated into buffers to zero: each step computes "
                           "them afresh inside the jitted step. Per-step host work belongs in "
                           "`on_train_batch_start`/`on_train_batch_end`",
    "backward": "the jitted step differentiates the returned loss with `jax.grad`; there is no "
                "backward call to replace. Return the loss from `training_step`",
    "optimizer_step": "the optax transformation `configure_optimizer(s)` returns is the update, inside "
                      "the jitted step. Express the custom step as an optax transformation "
                      "(`optax.chain`, `optax.MultiSteps`, `optax.inject_hyperparams`)",
    "optimizer_zero_grad": "gradients are computed afresh each step; there is nothing to zero. "
                           "Remove the hook",
    "lr_scheduler_step": "schedules are optax functions of the step, evaluated inside the jitted "
                         "step. Return `{'optimizer': tx, 'lr_scheduler': schedule}` from "
                         "`configure_optimizers` or build `tx` with the schedule",
    "configure_gradient_clipping": "clipping is a piece of the jitted step. Use "
                                   "`Trainer(gradient_clip_val=..., gradient_clip_algorithm=...)` or "
                                   "`optax.clip_by_global_norm` in the chain",
    "transfer_batch_to_device": "the strategy places each batch over its device mesh (sharded) in "
                                "the jitted step's call. Change the host batch in "
                                "`on_before_batch_transfer(batch, dataloader_idx)` instead",
    "configure_callbacks": "the Trainer builds its step with its callbacks' pieces when it is made. "
                           "Pass them there: `Trainer(callbacks=[...])`",
}


def check_hooks(module: Any, method: str, base: type) -> None:
    """Raises when `module` defines a hook fitjax refuses, saying why and what to write instead
    (every one it defines, at once)."""
    refused = [hook for hook in REFUSED_HOOKS if getattr(type(module), hook, None) is not getattr(base, hook, None)]
    if not refused:
        return
    owner = type(module).__name__
    lines = "\n".join(f"  - {owner}.{hook}: {REFUSED_HOOKS[hook]}." for hook in refused)
    raise TypeError(
        f"Trainer.{method}: {owner} defines Lightning hook(s) that cannot run in a JAX step, so fitjax "
        f"would never call them:\n{lines}\nRemove them (or rename them if they are your own helpers); "
        "host work per step belongs in `on_train_batch_start`/`on_train_batch_end`, which are called "
        "as in Lightning (see docs/porting.md, 'Module hooks')."
    )
