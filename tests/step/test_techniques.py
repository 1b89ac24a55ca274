"""Gradient accumulation, clipping, steps_per_execution, detect_anomaly and deterministic runs."""

from __future__ import annotations

import jax
import numpy as np
import optax
import pytest
from helpers import LossHistory, Poisoned, assert_trees_close, count_compiles, poisoned_data, quiet_trainer

import fitjax as fj


def _fit(module, data, *, batch_size, **kwargs):
    history = LossHistory()
    kwargs.setdefault("strategy", "single")
    trainer = quiet_trainer(callbacks=[history], **kwargs)
    trainer.fit(module, fj.DataLoader(data, batch_size=batch_size))
    return trainer, jax.device_get(module.variables), history.losses


def test_accumulating_4_batches_of_16_equals_one_batch_of_64():
    # No BatchNorm: its statistics are per micro-batch, so with it the two runs legitimately differ.
    # Tolerance: float32 summation order differs (4 partial means vs one mean); 1e-5 relative.
    data = poisoned_data(n=256)
    big, big_vars, big_losses = _fit(Poisoned(), data, batch_size=64, max_epochs=3, strategy="dp")
    acc, acc_vars, acc_losses = _fit(Poisoned(), data, batch_size=16, max_epochs=3, strategy="dp",
                                     accumulate_grad_batches=4)
    assert acc.global_step == big.global_step == 12
    np.testing.assert_allclose(acc_losses, big_losses, rtol=1e-5)
    assert_trees_close(acc_vars, big_vars, rtol=1e-5, atol=1e-6)
    assert acc.callback_metrics["train/loss_epoch"] == pytest.approx(big.callback_metrics["train/loss_epoch"], rel=1e-5)


def test_trailing_incomplete_group_steps_like_lightning_and_schedules_count_optimizer_steps():
    # 10 batches an epoch, k=4: steps after batches 4, 8 and 10 (the last one over 2 batches, each
    # loss still divided by 4 as in Lightning) -> 3 optimizer steps an epoch.
    data = poisoned_data(n=160)
    trainer, acc_vars, _ = _fit(Poisoned(optimizer="adam"), data, batch_size=16, max_epochs=2,
                                accumulate_grad_batches=4)
    assert trainer.global_step == 6
    assert int(optax.tree_utils.tree_get(trainer.state.opt_state, "count")) == 6  # schedule position

    # the same numbers by hand: batches of 64 whose loss is scaled so the last group's is 2/4
    class Weighted(Poisoned):
        def loss(self, model, batch):
            return super().loss(model, batch) * batch["w"].mean()

    order = np.concatenate([np.arange(160), np.arange(128, 160)])  # pad the last group to 64 rows
    by_hand = {k: v[order] for k, v in poisoned_data(n=160).items()}
    by_hand["w"] = np.where(np.arange(192) >= 128, 0.5, 1.0).astype(np.float32)
    _, hand_vars, _ = _fit(Weighted(optimizer="adam"), by_hand, batch_size=64, max_epochs=2)
    assert_trees_close(acc_vars, hand_vars, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("algorithm, clip", [("norm", optax.clip_by_global_norm), ("value", optax.clip)])
def test_clipping_matches_optax_clip_chained_by_hand(algorithm, clip):
    data = poisoned_data(n=128)

    class ClippedByHand(Poisoned):
        def configure_optimizer(self):
            return optax.chain(clip(0.05), super().configure_optimizer())

    _, ours, _ = _fit(Poisoned(), data, batch_size=32, max_epochs=2, gradient_clip_val=0.05,
                      gradient_clip_algorithm=algorithm)
    _, hand, _ = _fit(ClippedByHand(), data, batch_size=32, max_epochs=2)
    assert_trees_close(ours, hand, rtol=1e-6, atol=1e-7)
    if algorithm == "norm":  # the clip bites (so the comparison above means something)
        _, unclipped, _ = _fit(Poisoned(), data, batch_size=32, max_epochs=2)
        assert not np.allclose(jax.tree.leaves(ours)[0], jax.tree.leaves(unclipped)[0])


def test_grad_norm_is_the_norm_before_clipping():
    data = poisoned_data(n=32)
    module = Poisoned(lr=0.0)  # parameters stay at their initial values
    trainer, (params, _), _ = _fit(module, data, batch_size=32, max_steps=1, log_every_n_steps=1,
                                   gradient_clip_val=1e-3, log_grad_norm=True)

    def loss(p):
        pred = module.model.apply({"params": p}, data["x"], train=True)
        return ((pred - data["y"]) ** 2).mean()

    expected = float(optax.tree.norm(jax.grad(loss)(params)))
    assert expected > 1e-2  # far above the clip value: the logged norm is the unclipped one
    assert trainer.callback_metrics["train/grad_norm"] == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("accumulate", [1, 2])
def test_steps_per_execution_gives_the_same_params_and_epoch_metrics(accumulate):
    data = poisoned_data(n=320)  # 20 batches: 8 + 8 + 4 leftover steps run one at a time
    kwargs = dict(batch_size=16, max_epochs=2, accumulate_grad_batches=accumulate, strategy="dp",
                  log_every_n_steps=4)
    one, vars1, _ = _fit(Poisoned(optimizer="adam"), data, **kwargs)
    with count_compiles() as compiles:
        eight, vars8, losses8 = _fit(Poisoned(optimizer="adam"), data, steps_per_execution=8, **kwargs)
    assert eight.global_step == one.global_step
    assert_trees_close(vars8, vars1, rtol=1e-5, atol=1e-6)
    assert eight.callback_metrics["train/loss_epoch"] == pytest.approx(one.callback_metrics["train/loss_epoch"], rel=1e-5)
    assert compiles["train_step"] == (2 if 20 // accumulate % 8 else 1)  # the k-step one + leftovers
    # per-batch hooks fire once per dispatch
    per_epoch = 20 // accumulate
    assert len(losses8) == 2 * (per_epoch // 8 + per_epoch % 8)


def test_steps_per_execution_stops_exactly_at_max_steps():
    trainer, _, _ = _fit(Poisoned(), poisoned_data(n=320), batch_size=16, max_steps=13, steps_per_execution=8)
    assert trainer.global_step == 13 and int(trainer.state.step) == 13


@pytest.mark.parametrize("poison, lr, expected", [
    (dict(loss_poison_at=3), 0.05, "non-finite loss and gradients and parameters in optimizer step 3"),
    (dict(grad_poison_at=2), 0.05, "non-finite gradients and parameters in optimizer step 2"),
    ({}, float("inf"), "non-finite parameters in optimizer step 0"),
])
def test_detect_anomaly_names_the_step_and_the_quantity(poison, lr, expected):
    data = poisoned_data(n=128, **poison)
    with pytest.raises(FloatingPointError, match=expected):
        _fit(Poisoned(lr=lr), data, batch_size=16, max_epochs=1, detect_anomaly=True)
    if "gradients and" in expected:  # the same inside a scan of 4 steps
        with pytest.raises(FloatingPointError, match=expected):
            _fit(Poisoned(lr=lr), data, batch_size=16, max_epochs=1, detect_anomaly=True, steps_per_execution=4)


def test_deterministic_runs_are_bitwise_identical():
    def run():
        module = Poisoned(optimizer="adam")
        trainer = quiet_trainer(max_epochs=2, strategy="dp", deterministic=True, accumulate_grad_batches=2)
        trainer.fit(module, fj.DataLoader(poisoned_data(n=256), batch_size=32, shuffle=True, seed=3))
        return jax.device_get(module.variables)

    first, second = run(), run()
    for a, b in zip(jax.tree.leaves(first), jax.tree.leaves(second)):
        assert np.array_equal(a, b)


def test_deterministic_refuses_a_sharding_dependent_prng():
    jax.config.update("jax_default_prng_impl", "rbg")
    try:
        with pytest.raises(ValueError, match="jax_default_prng_impl='threefry2x32'.*'rbg'"):
            fj.Trainer(deterministic=True)
    finally:
        jax.config.update("jax_default_prng_impl", "threefry2x32")


@pytest.mark.parametrize("kwargs, match", [
    (dict(accumulate_grad_batches=0), r"accumulate_grad_batches=...\) must be a positive int, got 0"),
    (dict(steps_per_execution=2.0), r"steps_per_execution=...\) must be a positive int, got 2.0"),
    (dict(gradient_clip_val=-1), r"gradient_clip_val=...\) must be a positive number or None, got -1"),
    (dict(gradient_clip_algorithm="l2"), r"got 'l2'; use one of \['norm', 'value'\]"),
])
def test_bad_values_name_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        fj.Trainer(**kwargs)
