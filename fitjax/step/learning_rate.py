"""The learning rate of an optax optimizer: found, read and set in its state.

optax transformations keep a plain `learning_rate` in a closure, out of reach; one built with
`optax.inject_hyperparams` keeps it in its state (`hyperparams["learning_rate"]`), where it can
be read and set as an array: changing it changes a value of the state, never the program. This
module is the one place that finds such states, for every user of the rate: the step (a piece
such as SWA's annealing imposes it, `update`), the tuner (`lr_find` sets it from the host,
`set_host`) and the LearningRateMonitor (`named`: one value per group of `optax.multi_transform`).
Their error when the optimizer has no such state is `missing_error`.

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

__all__ = ["count", "current", "example", "find", "host_values", "missing_error", "named", "replace",
           "set_host", "update", "values"]

# `optax.inject_hyperparams` states (the stateful variant is what recent optax returns)
_INJECTED = tuple(getattr(optax, name) for name in ("InjectHyperparamsState", "InjectStatefulHyperparamsState")
                  if hasattr(optax, name))


def _is_injected(node: Any) -> bool:
    return isinstance(node, _INJECTED) and "learning_rate" in node.hyperparams


# ------------------------------------------------------------------------------ find and read


def find(opt_state: Any) -> list[tuple[tuple, Any]]:
    """Every `inject_hyperparams` state in `opt_state` that holds a learning rate, as `(path,
    state)` in tree order (static: it reads the structure, not the values)."""
    leaves = jax.tree_util.tree_flatten_with_path(opt_state, is_leaf=_is_injected)[0]
    return [(path, node) for path, node in leaves if _is_injected(node)]


def count(opt_state: Any) -> int:
    """How many `inject_hyperparams` learning rates `opt_state` holds (static)."""
    return len(find(opt_state))


def values(opt_state: Any) -> list[jax.Array]:
    """The injected learning rates as stored, in tree order: the ones the last update used
    (traced under jit; device arrays outside it)."""
    return [node.hyperparams["learning_rate"] for _, node in find(opt_state)]


def named(opt_state: Any) -> list[tuple[str, jax.Array]]:
    """`(group, learning rate)` for each injected state: the group is the last dict key on its
    path (the label of `optax.multi_transform`), else its index."""
    found = []
    for index, (path, node) in enumerate(find(opt_state)):
        keys = [str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey)]
        found.append((keys[-1] if keys else str(index), node.hyperparams["learning_rate"]))
    return found


def host_values(opt_state: Any) -> list[float]:
    """`values(opt_state)` as host floats: one transfer, a sync point."""
    return [float(v) for v in jax.device_get(values(opt_state))]


def current(opt_state: Any) -> jax.Array:
    """The (single) injected learning rate: the one the last update used, float32 (traced)."""
    found = values(opt_state)
    if len(found) != 1:
        raise missing_error("A piece of the train step (e.g. StochasticWeightAveraging)", len(found),
                            note=" (a schedule works too: `learning_rate=optax.cosine_decay_schedule(...)`)")
    return jnp.asarray(found[0], jnp.float32)


# ------------------------------------------------------------------------------------- set


def replace(opt_state: Any, fn: Callable[[jax.Array], jax.Array]) -> Any:
    """`opt_state` with each injected learning rate `old` replaced by `fn(old)`."""
    def put(node):
        if not _is_injected(node):
            return node
        return node._replace(hyperparams={**node.hyperparams, "learning_rate": fn(node.hyperparams["learning_rate"])})

    return jax.tree.map(put, opt_state, is_leaf=_is_injected)


def set_host(opt_state: Any, lr: float) -> Any:
    """`opt_state` with every injected learning rate set to the host number `lr`, with the dtype
    and device placement of the value it replaces (the step was compiled for them)."""
    return replace(opt_state, lambda old: jax.device_put(jnp.asarray(lr, old.dtype), old.sharding))


def _imposed(opt_state: Any, lr: jax.Array) -> Any:
    """`opt_state` with its learning rate set to the traced `lr` where `lr` is not NaN (dtype kept)."""
    def put(old):
        old = jnp.asarray(old)
        return jnp.where(jnp.isnan(lr), old, lr.astype(old.dtype))

    return replace(opt_state, put)


def update(update_fn: Callable, lr: jax.Array, grads: Any, opt_state: Any, *args, **kwargs):
    """`update_fn(grads, opt_state, *args, **kwargs)` with the learning rate `lr` imposed (a traced
    float32 scalar; NaN: the optimizer's own). See the module doc."""
    updates, new_state = update_fn(grads, _imposed(opt_state, lr), *args, **kwargs)
    used = current(new_state)
    # a zero rate gave a zero update: nothing to rescale (and no 0/0)
    scale = jnp.where(jnp.isnan(lr) | (used == 0), 1.0, lr / jnp.where(used == 0, 1.0, used))
    updates = jax.tree.map(lambda u: (u * scale.astype(u.dtype)).astype(u.dtype), updates)
    return updates, _imposed(new_state, lr)


# ----------------------------------------------------------------------------------- errors


def example(learning_rate: str = "1e-3") -> str:
    """How to expose the learning rate, as code: `optax.inject_hyperparams(optax.adam)(learning_rate=...)`."""
    return f"optax.inject_hyperparams(optax.adam)(learning_rate={learning_rate})"


def missing_error(who: str, found: int, *, module: Any = None, needs: str = "one",
                  learning_rate: str = "1e-3", note: str = "") -> ValueError:
    """The error of `who` (which drives the learning rate) when the optimizer state holds `found`
    injected learning rates and it needs `needs`: says how to expose one. `module` names the
    `LitModule`; `note` is the caller's own condition (e.g. lr_find's "a number")."""
    owner = f"{type(module).__name__}.configure_optimizer's optimizer" if module is not None else "the optimizer"
    return ValueError(
        f"{who} sets the learning rate through optax.inject_hyperparams, and {owner} state holds "
        f"{found} such learning rates; it needs {needs}. Return e.g. `{example(learning_rate)}` from "
        f"configure_optimizer{note}.")
