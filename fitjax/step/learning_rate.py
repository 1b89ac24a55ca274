"""The learning rate of an optax optimizer: found, read, set in its state, or imposed on its update.

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

The second route, for an optimizer with no injected rate: the module's `lr_schedule` (a number,
or a schedule `count -> lr` that `configure_optimizer` builds the optimizer from, e.g.
`optax.adam(self.lr_schedule)`). The rate the update applies is then `lr_schedule(count)`, `count`
being the optimizer's own update count before it, and the update is rescaled by `lr / that` (the
same rescaling). `check_follows_schedule` checks the optimizer really follows `lr_schedule`.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

__all__ = ["check_follows_schedule", "count", "current", "example", "find", "host_values", "last_used",
           "missing_error", "named", "replace", "schedule_of", "set_host", "update", "update_count", "values"]

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


def update_count(opt_state: Any) -> jax.Array | None:
    """The optimizer's update count: a `ScaleByScheduleState`'s (the count its schedule is
    evaluated at), else the first `count` field; None when the state has none (static)."""
    is_schedule = lambda n: isinstance(n, optax.ScaleByScheduleState)  # noqa: E731
    for node in jax.tree_util.tree_leaves(opt_state, is_leaf=is_schedule):
        if is_schedule(node):
            return node.count
    for path, leaf in jax.tree_util.tree_flatten_with_path(opt_state)[0]:
        if path and isinstance(path[-1], jax.tree_util.GetAttrKey) and path[-1].name == "count":
            return leaf
    return None


def _updates_done(opt_state: Any) -> jax.Array:
    """`update_count(opt_state)`, 0 when the state counts nothing (`optax.sgd(0.1)`: a constant
    rate, whatever the count)."""
    at = update_count(opt_state)
    return jnp.zeros((), jnp.int32) if at is None else at


def _scheduled(schedule: Callable[[Any], Any], at: jax.Array) -> jax.Array:
    return jnp.asarray(schedule(at), jnp.float32)


def schedule_of(module: Any) -> Callable[[Any], Any] | None:
    """The module's `lr_schedule` as a schedule `count -> lr` (a number: that constant), or None
    when the module has none."""
    schedule = getattr(module, "lr_schedule", None)
    if _is_number(schedule):
        value = float(schedule)
        return lambda count: jnp.float32(value)
    return schedule if callable(schedule) else None


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def last_used(opt_state: Any, schedule: Callable[[Any], Any] | None = None) -> jax.Array:
    """The learning rate the last update used, float32 (traced): the injected one, else (with no
    injected rate) `schedule(count - 1)`, `schedule(0)` before the first update."""
    if count(opt_state) == 0 and schedule is not None:
        return _scheduled(schedule, jnp.maximum(_updates_done(opt_state) - 1, 0))
    return current(opt_state)


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


def update(update_fn: Callable, lr: jax.Array, grads: Any, opt_state: Any, *args,
           schedule: Callable[[Any], Any] | None = None, **kwargs):
    """`update_fn(grads, opt_state, *args, **kwargs)` with the learning rate `lr` imposed (a traced
    float32 scalar; NaN: the optimizer's own). With no injected rate in `opt_state`, `schedule`
    (the module's `lr_schedule`, `schedule_of`) says the rate the update applies. See the module doc."""
    if count(opt_state) == 0 and schedule is not None:
        updates, new_state = update_fn(grads, opt_state, *args, **kwargs)
        return _rescaled(updates, lr, _scheduled(schedule, _updates_done(opt_state))), new_state
    updates, new_state = update_fn(grads, _imposed(opt_state, lr), *args, **kwargs)
    return _rescaled(updates, lr, current(new_state)), _imposed(new_state, lr)


def _rescaled(updates: Any, lr: jax.Array, used: jax.Array) -> Any:
    """`updates` (made at the rate `used`) times `lr / used`; unchanged where `lr` is NaN."""
    # a zero rate gave a zero update: nothing to rescale (and no 0/0)
    scale = jnp.where(jnp.isnan(lr) | (used == 0), 1.0, lr / jnp.where(used == 0, 1.0, used))
    return jax.tree.map(lambda u: (u * scale.astype(u.dtype)).astype(u.dtype), updates)


def check_follows_schedule(module: Any, params: Any, who: str) -> None:
    """Raises unless the update of `module.configure_optimizer()` is proportional to the module's
    `lr_schedule`, which the rescaling relies on: the optimizer is built twice, with `lr_schedule`
    replaced by the constant 1 and then 2, and the update of `params` from the initial state must
    double. The module's `lr_schedule` is put back as it was. Costs two optimizer states and
    updates of `params`, once."""
    owner = type(module).__name__
    original, own = module.lr_schedule, "lr_schedule" in vars(module)
    updates = []
    try:
        for value in (1.0, 2.0):
            probe = value if _is_number(original) else (lambda count, v=value: jnp.float32(v))
            module.lr_schedule = probe
            tx = optax.with_extra_args_support(module.configure_optimizer())
            if module.lr_schedule is not probe:
                raise ValueError(
                    f"{who}: {owner}.configure_optimizer assigns self.lr_schedule itself, so {who} cannot "
                    "check that the optimizer follows it. Set `self.lr_schedule = ...` before (e.g. in "
                    "__init__) and build the optimizer from it: `optax.adam(self.lr_schedule)`.")
            grads = jax.tree.map(jnp.ones_like, params)
            update, _ = tx.update(grads, tx.init(params), params, value=jnp.zeros((), jnp.float32))
            updates.append([np.asarray(u, np.float64) for u in jax.tree.leaves(update)])
    finally:
        if own:
            module.lr_schedule = original
        elif "lr_schedule" in vars(module):  # a class attribute: the instance's own value goes
            del module.lr_schedule
    one, two = updates
    moved = any(np.any(u != 0) for u in one)
    if not moved or not all(np.allclose(b, 2 * a, rtol=1e-5, atol=0) for a, b in zip(one, two)):
        raise ValueError(
            f"{who} imposes its learning rate through {owner}.lr_schedule={original!r}, but "
            f"{owner}.configure_optimizer's optimizer does not follow it: built with lr_schedule at 1 and "
            "at 2, its first update did not double. Build the optimizer from it (e.g. "
            f"`optax.adam(self.lr_schedule)`), or return `{example('self.hparams.lr')}` instead.")


# ----------------------------------------------------------------------------------- errors


def example(learning_rate: str = "1e-3") -> str:
    """How to expose the learning rate, as code: `optax.inject_hyperparams(optax.adam)(learning_rate=...)`."""
    return f"optax.inject_hyperparams(optax.adam)(learning_rate={learning_rate})"


def missing_error(who: str, found: int, *, module: Any = None, needs: str = "one",
                  learning_rate: str = "1e-3", note: str = "", or_schedule: bool = False) -> ValueError:
    """The error of `who` (which drives the learning rate) when the optimizer state holds `found`
    injected learning rates and it needs `needs`: says how to expose one. `module` names the
    `LitModule`; `note` is the caller's own condition (e.g. lr_find's "a number"); `or_schedule`:
    `who` also takes the module's `lr_schedule` (the module has none), and the error says so."""
    name = type(module).__name__ if module is not None else "the module"
    owner = f"{name}.configure_optimizer's optimizer" if module is not None else "the optimizer"
    if not or_schedule:
        return ValueError(
            f"{who} sets the learning rate through optax.inject_hyperparams, and {owner} state holds "
            f"{found} such learning rates; it needs {needs}. Return e.g. `{example(learning_rate)}` from "
            f"configure_optimizer{note}.")
    return ValueError(
        f"{who} sets the learning rate through optax.inject_hyperparams or the module's lr_schedule; "
        f"{owner} state holds {found} injected learning rates (it needs {needs}) and {name} has no "
        f"lr_schedule (a number or a schedule `count -> lr`). Either return e.g. `{example(learning_rate)}` "
        f"from configure_optimizer{note}, or set `self.lr_schedule = {learning_rate}` (e.g. in __init__) "
        "and build the optimizer from it: `optax.adam(self.lr_schedule)`.")
