"""Trainer.fit / validate / test / predict as a user runs them, on one device and on 8."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from helpers import LossHistory, Regressor, assert_trees_close, count_compiles, quiet_trainer, regression_data

import fitjax as fj
from digits import DigitsClassifier, digits_splits


@pytest.fixture(scope="module")
def digits():
    return digits_splits()


@pytest.mark.parametrize("model", ["linen", "nnx"])
def test_digits_trains_past_accuracy_bar(digits, model, tmp_path):
    train, val = digits
    loader = fj.DataLoader(train, batch_size=64, shuffle=True, drop_last=True)
    module = DigitsClassifier(lr=3e-3, model=model, total_steps=8 * len(loader))
    trainer = quiet_trainer(max_epochs=8, default_root_dir=tmp_path, strategy="single")
    trainer.fit(module, loader, fj.DataLoader(val, batch_size=128))
    assert trainer.callback_metrics["val/acc"] >= 0.95
    assert trainer.global_step == 8 * len(loader)
    assert trainer.current_epoch == 8
    # the trained weights live on the module: validate without fit state gives the same numbers
    (again,) = quiet_trainer(strategy="single").validate(module, fj.DataLoader(val, batch_size=100))
    assert again["val/acc"] == pytest.approx(trainer.callback_metrics["val/acc"], abs=1e-6)


def _fit_regressor(strategy, devices, **kwargs):
    data = regression_data(n=256)
    history = LossHistory()
    trainer = quiet_trainer(max_epochs=3, strategy=strategy, devices=devices, callbacks=[history],
                            log_every_n_steps=4, **kwargs)
    module = Regressor()
    trainer.fit(module, fj.DataLoader(data, batch_size=32, shuffle=True, seed=1),
                fj.DataLoader(regression_data(n=100, seed=1), batch_size=32))
    return trainer, module, history.losses


def test_dp_on_8_devices_matches_single_device():
    single, m1, losses1 = _fit_regressor("single", 1)
    dp, m8, losses8 = _fit_regressor("dp", 8)
    assert len(jax.tree.leaves(dp.state.params)[0].sharding.device_set) == 8
    np.testing.assert_allclose(losses8, losses1, rtol=1e-5, atol=1e-6)
    assert_trees_close(m8.variables, m1.variables, rtol=1e-5, atol=1e-6)
    for key in ("val/loss", "val/mae", "train/loss_epoch"):
        assert dp.callback_metrics[key] == pytest.approx(single.callback_metrics[key], rel=1e-5)


def test_loss_goes_down_and_counters_follow_lightning():
    trainer, _, losses = _fit_regressor("single", 1)
    assert np.mean(losses[-8:]) < 0.2 * np.mean(losses[:8])
    assert trainer.global_step == 3 * 8 and trainer.current_epoch == 3
    assert {"train/loss", "train/mae", "train/loss_epoch", "val/loss", "val/mae"} <= set(trainer.callback_metrics)


def test_batchnorm_statistics_update_in_train_and_are_used_in_eval():
    module = Regressor()
    data = regression_data(n=128)
    trainer = quiet_trainer(max_steps=5, strategy="single")
    trainer.fit(module, fj.DataLoader(data, batch_size=32))
    params, state = module.variables
    stats = state["batch_stats"]["BatchNorm_0"]
    assert np.abs(np.asarray(stats["mean"])).max() > 1e-3  # moved away from the zero init

    # eval uses the running averages: a single example gets the same prediction alone or in a batch
    single = trainer.predict(module, fj.DataLoader({"x": data["x"][:1]}, batch_size=1))
    batched = trainer.predict(module, fj.DataLoader({"x": data["x"][:64]}, batch_size=64))
    np.testing.assert_allclose(single[0], batched[0], rtol=1e-5, atol=1e-6)


def test_step_compiles_once_across_steps_epochs_and_partial_eval_batch():
    data = regression_data(n=256)
    val = regression_data(n=100, seed=1)  # 100 = 3 full batches of 32 + a partial one of 4
    trainer = quiet_trainer(max_epochs=3, strategy="dp", devices=8, log_every_n_steps=3)
    module = Regressor()
    with count_compiles() as compiles:
        trainer.fit(module, fj.DataLoader(data, batch_size=32, shuffle=True), fj.DataLoader(val, batch_size=32))
        trainer.validate(module, fj.DataLoader(val, batch_size=32))
    assert compiles["train_step"] == 1
    assert compiles["eval_step"] == 1


def test_validation_counts_every_example_exactly_once():
    data = regression_data(n=100, seed=1)
    module = Regressor()
    trainer = quiet_trainer(max_steps=3, strategy="dp", devices=8)
    trainer.fit(module, fj.DataLoader(regression_data(), batch_size=32))
    (res_odd,) = trainer.validate(module, fj.DataLoader(data, batch_size=24))  # 4×24 + 4
    (res_one,) = trainer.validate(module, fj.DataLoader(data, batch_size=100))
    preds = trainer.predict(module, fj.DataLoader({"x": data["x"]}, batch_size=100))
    expected = float(np.mean((preds - data["y"]) ** 2))
    assert res_odd["val/loss"] == pytest.approx(expected, rel=1e-5)
    assert res_one["val/loss"] == pytest.approx(expected, rel=1e-5)


def test_num_val_batches_is_known_when_validation_starts():
    # a progress bar draws its total at on_validation_start: the count is set before the hooks
    class Seen(fj.Callback):
        def __init__(self):
            self.at_start = []

        def on_validation_start(self, trainer, module):
            self.at_start.append((trainer.sanity_checking, trainer.num_val_batches))

    seen = Seen()
    val = fj.DataLoader(regression_data(n=100, seed=1), batch_size=32)  # 4 batches, the last partial
    trainer = quiet_trainer(max_epochs=2, callbacks=[seen], num_sanity_val_steps=2)
    trainer.fit(Regressor(), fj.DataLoader(regression_data(n=64), batch_size=32), val)
    trainer.validate(Regressor(), val)
    assert seen.at_start == [(True, [2]), (False, [4]), (False, [4]), (False, [4])]  # a count per loader


def test_predict_returns_every_example_once_in_input_order():
    n = 77
    x = np.arange(n, dtype=np.float32)[:, None] * np.ones((1, 8), np.float32)
    module = Regressor(batchnorm=False)
    trainer = quiet_trainer(strategy="dp", devices=8)
    out = trainer.predict(module, fj.DataLoader({"x": x}, batch_size=16))
    assert out.shape == (n, 1)
    # the model is affine in x, so outputs are monotone in the row index
    diffs = np.diff(out[:, 0])
    assert np.all(diffs > 0) or np.all(diffs < 0)
    # and exactly equal to predicting each row on its own
    alone = trainer.predict(module, fj.DataLoader({"x": x[40:41]}, batch_size=1))
    np.testing.assert_allclose(out[40], alone[0], rtol=1e-6)


def test_test_stage_uses_test_prefix():
    module = Regressor()
    trainer = quiet_trainer(max_steps=2, strategy="single")
    trainer.fit(module, fj.DataLoader(regression_data(), batch_size=32))
    (res,) = trainer.test(module, fj.DataLoader(regression_data(n=50, seed=3), batch_size=16))
    assert set(res) == {"test/loss", "test/mae"}


def test_max_steps_limits_and_fast_dev_run():
    data = fj.DataLoader(regression_data(), batch_size=32)  # 8 batches an epoch
    t = quiet_trainer(max_steps=5, strategy="single")
    t.fit(Regressor(), data)
    assert t.global_step == 5

    t = quiet_trainer(max_epochs=2, limit_train_batches=3, strategy="single")
    t.fit(Regressor(), data)
    assert t.global_step == 6 and t.current_epoch == 2

    t = quiet_trainer(max_epochs=2, limit_train_batches=0.5, strategy="single")
    t.fit(Regressor(), data)
    assert t.global_step == 8

    t = fj.Trainer(fast_dev_run=True, strategy="single", enable_progress_bar=False)
    t.fit(Regressor(), data, data)
    assert t.global_step == 1 and t.loggers == [] and "val/loss" in t.callback_metrics


def test_val_check_interval_and_check_val_every_n_epoch():
    class CountVal(fj.Callback):
        def __init__(self):
            self.steps = []

        def on_validation_end(self, trainer, module):
            self.steps.append(trainer.global_step)

    data = fj.DataLoader(regression_data(), batch_size=32)  # 8 batches
    val = fj.DataLoader(regression_data(n=64, seed=2), batch_size=32)
    counter = CountVal()
    # Lightning: every 3 batches of each epoch, none at its end (8 is no multiple of 3); the
    # sanity check (step 0) first
    quiet_trainer(max_epochs=2, val_check_interval=3, strategy="single", callbacks=[counter]).fit(Regressor(), data, val)
    assert counter.steps == [0, 3, 6, 11, 14]

    counter = CountVal()
    quiet_trainer(max_epochs=4, check_val_every_n_epoch=2, strategy="single", num_sanity_val_steps=0,
                  callbacks=[counter]).fit(Regressor(), data, val)
    assert counter.steps == [16, 32]

    counter = CountVal()
    quiet_trainer(max_epochs=1, val_check_interval=0.5, strategy="single", num_sanity_val_steps=0,
                  callbacks=[counter]).fit(Regressor(), data, val)
    assert counter.steps == [4, 8]


def test_hparams_and_save_hyperparameters():
    module = Regressor(lr=0.3)
    assert module.hparams.lr == 0.3 and module.hparams["batchnorm"] is True
    assert dict(module.hparams) == {"lr": 0.3, "batchnorm": True}


def test_a_second_fit_continues_from_the_trained_weights():
    data = fj.DataLoader(regression_data(), batch_size=32)
    module = Regressor()
    t1 = quiet_trainer(max_steps=20, strategy="single")
    t1.fit(module, data)
    first = jax.device_get(module.variables)
    (before,) = quiet_trainer(strategy="single").validate(module, data)
    quiet_trainer(max_steps=20, strategy="single").fit(module, data)
    (after,) = quiet_trainer(strategy="single").validate(module, data)
    assert after["val/loss"] < before["val/loss"]
    assert np.isfinite(jax.tree.leaves(first)[0]).all()  # the first fit's arrays were not donated away
