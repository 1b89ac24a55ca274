"""The learning rate of an optax optimizer, read and overridden inside the jitted step.

A piece around the step (SWA's annealing) may impose the learning rate of the next update. optax
transformations keep a plain `learning_rate` in a closure, out of reach; one built with
`optax.inject_hyperparams` keeps it in its state (`hyperparams["learning_rate"]`), where it can
be read and set as an array: changing it changes a value of the state, never the program.

How an imposed rate `lr` takes effect (`update`): it is written into the state before the update,
which is all a number-valued hyperparameter needs. A schedule-valued one (`inject_hyperparams(
opt)(learning_rate=schedule)`, or Lightning's `lr_scheduler`) is evaluated again inside the update
and wins; the update is then rescaled by `lr / used`, exact for every optimizer whose update is
proportional to its learning rate (all of optax's aliases: the rate is their last scaling). When
the write took effect `lr / used` is exactly 1 and the update is unchanged bit for bit.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

__all__ = ["count", "current", "update"]

_INJECTED = tuple(getattr(optax, name) for name in ("InjectHyperparamsState", "InjectStatefulHyperparamsState")
                  if hasattr(optax, name))


def _is_injected(node: Any) -> bool:
    return isinstance(node, _INJECTED) and "learning_rate" in node.hyperparams


def _states(opt_state: Any) -> list:
    return [n for n in jax.tree.leaves(opt_state, is_leaf=_is_injected) if _is_injected(n)]


def count(opt_state: Any) -> int:
    """How many `inject_hyperparams` learning rates `opt_state` holds (static)."""
    return len(_states(opt_state))


def current(opt_state: Any) -> jax.Array:
    """The (single) injected learning rate: the one the last update used, float32 (traced)."""
    states = _states(opt_state)
    if len(states) != 1:
        raise ValueError(
            f"the learning rate is set through optax.inject_hyperparams, and the optimizer state holds "
            f"{len(states)} injected learning rates; one is needed: return e.g. "
            "`optax.inject_hyperparams(optax.adam)(learning_rate=1e-3)` from configure_optimizer "
            "(a schedule works too: `learning_rate=optax.cosine_decay_schedule(...)`).")
    return jnp.asarray(states[0].hyperparams["learning_rate"], jnp.float32)


def _with_lr(opt_state: Any, lr: jax.Array) -> Any:
    """`opt_state` with its learning rate set to `lr` where `lr` is not NaN (dtype kept)."""
    def put(node):
        if not _is_injected(node):
            return node
        old = jnp.asarray(node.hyperparams["learning_rate"])
        new = jnp.where(jnp.isnan(lr), old, lr.astype(old.dtype))
        return node._replace(hyperparams={**node.hyperparams, "learning_rate": new})

    return jax.tree.map(put, opt_state, is_leaf=_is_injected)


def update(update_fn: Callable, lr: jax.Array, grads: Any, opt_state: Any, *args, **kwargs):
    """`update_fn(grads, opt_state, *args, **kwargs)` with the learning rate `lr` imposed (a traced
    float32 scalar; NaN: the optimizer's own). See the module doc."""
    updates, new_state = update_fn(grads, _with_lr(opt_state, lr), *args, **kwargs)
    used = current(new_state)
    # a zero rate gave a zero update: nothing to rescale (and no 0/0)
    scale = jnp.where(jnp.isnan(lr) | (used == 0), 1.0, lr / jnp.where(used == 0, 1.0, used))
    updates = jax.tree.map(lambda u: (u * scale.astype(u.dtype)).astype(u.dtype), updates)
    return updates, _with_lr(new_state, lr)
