"""`fitjax.step.learning_rate`: the one place that finds, reads and sets injected learning rates
(used by the step's imposed rate, `Tuner.lr_find` and `LearningRateMonitor`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fitjax.step import learning_rate as lr_lib

PARAMS = {"dense": jnp.ones(3), "norm": jnp.ones(2)}


def _groups():
    return optax.multi_transform(
        {"dense": optax.chain(optax.clip(1.0), optax.inject_hyperparams(optax.sgd)(learning_rate=0.1)),
         "norm": optax.inject_hyperparams(optax.adam)(learning_rate=0.01)},
        {"dense": "dense", "norm": "norm"})


def test_groups_are_found_with_their_names_in_tree_order():
    state = _groups().init(PARAMS)
    assert lr_lib.count(state) == 2
    assert [g for g, _ in lr_lib.named(state)] == ["dense", "norm"]
    assert lr_lib.host_values(state) == pytest.approx([0.1, 0.01])
    # an optimizer without inject_hyperparams has none; one without groups is named by its index
    assert lr_lib.count(optax.adam(1e-3).init(PARAMS)) == 0
    assert [g for g, _ in lr_lib.named(optax.inject_hyperparams(optax.sgd)(learning_rate=0.1).init(PARAMS))] == ["0"]


def test_set_host_keeps_dtype_and_placement_of_every_group():
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    state = jax.device_put(_groups().init(PARAMS), replicated)
    new = lr_lib.set_host(state, 0.5)
    assert lr_lib.host_values(new) == [0.5, 0.5]
    for (_, old), (_, value) in zip(lr_lib.named(state), lr_lib.named(new)):
        assert value.dtype == old.dtype and value.sharding == old.sharding


def test_an_imposed_rate_overrides_a_schedule_and_nan_leaves_the_update_bitwise():
    tx = optax.inject_hyperparams(optax.adam)(learning_rate=optax.linear_schedule(1.0, 0.0, 10))
    grads = {"dense": jnp.array([0.3, -1.0, 2.0]), "norm": jnp.array([1.0, 0.5])}
    state = tx.init(PARAMS)
    own, own_state = tx.update(grads, state, PARAMS)
    kept, kept_state = lr_lib.update(tx.update, jnp.float32(jnp.nan), grads, state, PARAMS)
    assert jax.tree.all(jax.tree.map(lambda a, b: bool((a == b).all()), (own, own_state), (kept, kept_state)))
    imposed, imposed_state = jax.jit(lambda s: lr_lib.update(tx.update, jnp.float32(0.25), grads, s, PARAMS))(state)
    assert float(lr_lib.current(imposed_state)) == 0.25
    for a, b in zip(jax.tree.leaves(imposed), jax.tree.leaves(own)):
        np.testing.assert_allclose(a, b * 0.25, rtol=1e-6)  # the schedule's first rate is 1.0


def test_the_error_says_how_to_expose_the_learning_rate():
    with pytest.raises(ValueError, match=r"holds 0 such learning rates; it needs one\. Return e\.g\. "
                                         r"`optax\.inject_hyperparams\(optax\.adam\)\(learning_rate=1e-3\)`"):
        lr_lib.current(optax.adam(1e-3).init(PARAMS))


def test_through_an_lr_schedule_the_update_is_rescaled_to_the_imposed_rate():
    """No injected rate: the update made at `schedule(count)` is rescaled to the imposed rate, at
    every count (the optimizer's own, from its state); NaN leaves it bitwise."""
    schedule = optax.linear_schedule(1.0, 0.5, 4)
    grads = {"dense": jnp.array([0.3, -1.0, 2.0]), "norm": jnp.array([1.0, 0.5])}
    tx, fixed = optax.adam(schedule), optax.adam(0.25)
    state, fixed_state = tx.init(PARAMS), fixed.init(PARAMS)
    step = jax.jit(lambda lr, s, g, p: lr_lib.update(tx.update, lr, g, s, p, schedule=schedule))
    for count in range(3):
        assert float(lr_lib.last_used(state, schedule)) == float(schedule(max(count - 1, 0)))
        own, _ = jax.jit(tx.update)(grads, state, PARAMS)
        kept, _ = step(jnp.float32(jnp.nan), state, grads, PARAMS)
        assert all(bool((a == b).all()) for a, b in zip(jax.tree.leaves(own), jax.tree.leaves(kept)))
        imposed, state = step(jnp.float32(0.25), state, grads, PARAMS)
        expected, fixed_state = fixed.update(grads, fixed_state, PARAMS)
        for a, b in zip(jax.tree.leaves(imposed), jax.tree.leaves(expected)):
            np.testing.assert_allclose(a, b, rtol=1e-6)
