"""What Lightning's `configure_optimizers` may return, turned into one optax transformation.

Accepted: an optax transformation; `{"optimizer": tx, "lr_scheduler": schedule}` where the
schedule is an optax schedule (a function of the optimizer step) or Lightning's
`{"scheduler": schedule, "interval": "step"}` config; and, for several parameter groups (a GAN),
`{group: tx}` keyed by the top-level keys of the model's params (built with
`optax.multi_transform`). Torch optimizers and schedulers get an error naming their optax
counterpart: optax schedules are pure functions of the step, evaluated inside the jitted update.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

__all__ = ["from_configure_optimizers"]

_TORCH_COUNTERPARTS = {
    "Adam": "optax.adam(lr)",
    "AdamW": "optax.adamw(lr, weight_decay=...)",
    "SGD": "optax.sgd(lr, momentum=...)",
    "RMSprop": "optax.rmsprop(lr)",
    "Adagrad": "optax.adagrad(lr)",
    "StepLR": "optax.exponential_decay(lr, transition_steps=step_size * steps_per_epoch, "
              "decay_rate=gamma, staircase=True)",
    "MultiStepLR": "optax.piecewise_constant_schedule(lr, {epoch * steps_per_epoch: gamma, ...})",
    "ExponentialLR": "optax.exponential_decay(lr, transition_steps=steps_per_epoch, decay_rate=gamma)",
    "CosineAnnealingLR": "optax.cosine_decay_schedule(lr, decay_steps=T_max * steps_per_epoch)",
    "CosineAnnealingWarmRestarts": "optax.sgdr_schedule([...])",
    "OneCycleLR": "optax.cosine_onecycle_schedule(total_steps, max_lr)",
    "LinearLR": "optax.linear_schedule(init_value, end_value, transition_steps)",
    "LambdaLR": "a function of the step written with jax.numpy, e.g. `lambda step: lr * 0.95 ** (step // n)`",
    "SequentialLR": "optax.join_schedules([...], boundaries=[...])",
    "ReduceLROnPlateau": "optax.contrib.reduce_on_plateau(factor=..., patience=..., "
                         "accumulation_size=steps_per_epoch) chained after the optimizer: "
                         "`optax.chain(optax.adam(lr), optax.contrib.reduce_on_plateau(...))`; fitjax "
                         "passes it the training loss of every step",
}


def _is_tx(obj: Any) -> bool:
    return isinstance(obj, optax.GradientTransformation) or (
        callable(getattr(obj, "init", None)) and callable(getattr(obj, "update", None)))


def _reject_torch(owner: str, obj: Any, what: str) -> None:
    module = type(obj).__module__ or ""
    if module.split(".")[0] != "torch":
        return
    name = type(obj).__name__
    counterpart = _TORCH_COUNTERPARTS.get(name, "the optax transformation or schedule of the same name")
    raise TypeError(
        f"{owner}.configure_optimizers returned a torch {name} as {what}; fitjax updates JAX "
        f"parameters with optax. Use {counterpart}. Schedules count optimizer steps, not epochs "
        "(multiply epoch counts by the batches per epoch)."
    )


def from_configure_optimizers(owner: str, value: Any) -> optax.GradientTransformation:
    """One optax transformation from what `configure_optimizers` returned (see the module doc)."""
    _reject_torch(owner, value, "the optimizer")
    if _is_tx(value):
        return value
    if isinstance(value, dict) and "optimizer" in value:
        return _with_scheduler(owner, value)
    if isinstance(value, dict) and value and all(_is_tx(v) for v in value.values()):
        return _per_group(owner, value)
    if isinstance(value, (list, tuple)) and _single(value) is not None:
        return from_configure_optimizers(owner, _single(value))
    if isinstance(value, (list, tuple)):
        raise TypeError(
            f"{owner}.configure_optimizers returned a {type(value).__name__}: {value!r}. fitjax "
            "needs to know which parameters each optimizer updates: return a dict "
            "`{param group: optax transformation}` keyed by the top-level keys of the model's "
            "params, e.g. `{'generator': optax.adam(2e-4), 'discriminator': optax.adam(2e-4)}`, "
            "or one transformation for all of them."
        )
    raise TypeError(
        f"{owner}.configure_optimizers must return an optax transformation, "
        f"{{'optimizer': tx, 'lr_scheduler': schedule}} or {{param group: tx}}, got "
        f"{type(value).__name__}: {value!r}."
    )


def _single(value: list | tuple) -> Any:
    """Lightning's list forms with one optimizer, as the dict form: `[tx]`, `[config]` and
    `([tx], [scheduler])` (the shape of every torch SGD/Adam with a scheduler); None for
    several optimizers (parameter groups need `{group: tx}`)."""
    if len(value) == 1:
        return value[0]
    if (len(value) == 2 and all(isinstance(v, (list, tuple)) for v in value)
            and len(value[0]) == 1 and len(value[1]) <= 1):
        return {"optimizer": value[0][0], "lr_scheduler": value[1][0] if value[1] else None}
    return None


def _with_scheduler(owner: str, config: dict) -> optax.GradientTransformation:
    unknown = sorted(set(config) - {"optimizer", "lr_scheduler", "monitor"})
    if unknown:
        raise ValueError(f"{owner}.configure_optimizers: unknown keys {unknown} in {config!r}; "
                         "allowed: 'optimizer', 'lr_scheduler'.")
    optimizer, scheduler = config["optimizer"], config.get("lr_scheduler")
    _reject_torch(owner, optimizer, "'optimizer'")
    if isinstance(scheduler, dict):
        interval = scheduler.get("interval", "epoch")  # Lightning's default
        if interval != "step" or scheduler.get("frequency", 1) != 1:
            raise ValueError(
                f"{owner}.configure_optimizers: lr_scheduler={scheduler!r} steps every "
                f"{scheduler.get('frequency', 1)} {interval}(s); an optax schedule is a function of "
                "the optimizer step. Express it in steps (epochs * batches per epoch) and pass "
                "`'lr_scheduler': {'scheduler': schedule, 'interval': 'step'}` or the schedule itself."
            )
        scheduler = scheduler.get("scheduler")
    _reject_torch(owner, scheduler, "'lr_scheduler'")
    if scheduler is None:
        return from_configure_optimizers(owner, optimizer)
    if not callable(scheduler):
        raise TypeError(f"{owner}.configure_optimizers: 'lr_scheduler' must be an optax schedule "
                        f"(a function of the step), got {type(scheduler).__name__}: {scheduler!r}.")
    if _is_tx(optimizer):
        return _driven(owner, optimizer, scheduler)
    if callable(optimizer):  # a factory such as `optax.adam` or `functools.partial(optax.adamw, ...)`
        return optax.inject_hyperparams(optimizer)(learning_rate=scheduler)
    raise TypeError(f"{owner}.configure_optimizers: 'optimizer' must be an optax transformation or "
                    f"factory (`optax.adam`), got {type(optimizer).__name__}: {optimizer!r}.")


def _is_injected(state: Any) -> bool:
    hyperparams = getattr(state, "hyperparams", None)
    return isinstance(hyperparams, dict) and "learning_rate" in hyperparams


def _driven(owner: str, tx: Any, schedule: Callable) -> optax.GradientTransformation:
    """`tx` with its learning rate set by `schedule`: every `optax.inject_hyperparams` state in
    it, at its top or inside a chain (`optax.chain(optax.add_decayed_weights(wd),
    optax.inject_hyperparams(optax.sgd)(learning_rate=0.1))`, torch's `weight_decay=`), gets
    `schedule(count)` as its rate."""

    def set_lr(state):
        found = []

        def drive(inner):
            if not _is_injected(inner):
                return inner
            found.append(inner)
            hyperparams = inner.hyperparams
            lr = jnp.asarray(schedule(inner.count), jnp.asarray(hyperparams["learning_rate"]).dtype)
            return inner._replace(hyperparams={**hyperparams, "learning_rate": lr})

        state = jax.tree.map(drive, state, is_leaf=_is_injected)
        if not found:
            raise TypeError(
                f"{owner}.configure_optimizers: an optax transformation fixes its learning rate "
                "when built, so fitjax cannot drive it from 'lr_scheduler'. Pass the schedule as "
                "the learning rate (`optax.adam(schedule)`), the factory (`'optimizer': optax.adam`), "
                "or build it with `optax.inject_hyperparams(optax.adam)(learning_rate=1e-3)` (also "
                "inside an `optax.chain`)."
            )
        return state

    def init(params):
        return set_lr(tx.init(params))

    def update(updates, state, params=None, **extra_args):
        return optax.with_extra_args_support(tx).update(updates, set_lr(state), params, **extra_args)

    return optax.GradientTransformationExtraArgs(init, update)


def _per_group(owner: str, transforms: dict) -> optax.GradientTransformation:
    def labels(params):
        missing = sorted(set(params) - set(transforms))
        if missing:
            raise ValueError(
                f"{owner}.configure_optimizers gave optimizers for {sorted(transforms)} but the "
                f"model's params also hold {missing}; give every top-level group one (use "
                "`optax.set_to_zero()` to freeze a group)."
            )
        return {group: group for group in params}

    return optax.multi_transform(dict(transforms), labels)
