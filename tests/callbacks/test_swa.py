"""Stochastic weight averaging: Lightning's learning rates and averaged epochs (numbers from a real
Lightning run), the average by hand under every strategy with accumulation and bf16, an exact
resume, eval on the average, BatchNorm statistics recomputed as by hand, one compile per shape."""

from __future__ import annotations

import math

import jax
import numpy as np
import optax
from flax import nnx
import pytest
from helpers import (MLP, Regressor, assert_trees_close, count_compiles, quiet_trainer,
                     regression_data)

import fitjax as fj
from fitjax.step import learning_rate as lr_lib
from fitjax.module import set_variables
from fitjax.strategies import FSDP


pytestmark = pytest.mark.usefixtures("compile_cache")  # tests/conftest.py


class SWARegressor(Regressor):
    """`Regressor` with its learning rate exposed through `optax.inject_hyperparams`."""

    def __init__(self, lr: float = 0.05, batchnorm: bool = False, schedule: bool = False):
        super().__init__(lr=lr, batchnorm=batchnorm)
        self.schedule = schedule

    def configure_optimizer(self):
        lr = optax.linear_schedule(self.hparams.lr, 0.0, 1000) if self.schedule else self.hparams.lr
        return optax.inject_hyperparams(optax.sgd)(learning_rate=lr, momentum=0.9)


class EpochRecord(fj.Callback):
    """The params at each epoch start and the learning rate of each epoch's first step."""

    def __init__(self):
        self.starts, self.lrs = [], []

    def on_train_epoch_start(self, trainer, module):
        self.starts.append(jax.device_get(trainer.state.params))
        self.lrs.append(None)

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if self.lrs[-1] is None:  # the rate the update used (the state keeps it)
            self.lrs[-1] = float(lr_lib.current(trainer.state.opt_state))


def _mean_by_hand(trees):
    """torch's AveragedModel: avg <- p, then avg + (p - avg) / (n + 1), in float32 (numpy; the
    tests allow rtol 1e-6: XLA may fuse the same float32 operations in another order)."""
    avg = None
    for n, tree in enumerate(trees):
        tree = jax.tree.map(lambda p: np.asarray(p, np.float32), tree)
        avg = tree if avg is None else jax.tree.map(
            lambda a, p: a + (p - a) / np.float32(n + 1), avg, tree)
    return avg


def _swalr(lr0, swa_lr, epochs, swa_start, annealing_epochs, strategy):
    """torch's SWALR as Lightning steps it (per epoch from `swa_start`), by hand."""
    out = []
    for epoch in range(epochs):
        if epoch < swa_start:
            out.append(lr0)
            continue
        t = min(1.0, (epoch - swa_start) / max(1, annealing_epochs))
        alpha = (1 - math.cos(math.pi * t)) / 2 if strategy == "cos" else t
        out.append(swa_lr * alpha + lr0 * (1 - alpha))
    return out


# From Lightning 2.x (torch CPU): a 2->1 Linear on 8 examples, batch 4, SGD(lr=0.1), max_epochs=6,
# StochasticWeightAveraging(swa_lrs=0.01, swa_epoch_start=2, annealing_epochs=3, annealing_strategy=s);
# `optimizer.param_groups[0]["lr"]` at each epoch's first batch. The same run's final weights were
# the mean of the weights at the starts of epochs 1..5 (0-based): the last epoch's updates are not
# in the average.
LIGHTNING_LRS = {"cos": [0.1, 0.1, 0.07750000000000001, 0.032500000000000015, 0.01, 0.01],
                 "linear": [0.1, 0.1, 0.07, 0.04000000000000001, 0.01, 0.01]}
LIGHTNING_AVERAGED_EPOCHS = range(1, 6)


@pytest.mark.parametrize("strategy", ["cos", "linear"])
def test_learning_rates_and_averaged_epochs_match_lightning(strategy):
    record = EpochRecord()
    swa = fj.StochasticWeightAveraging(swa_lrs=0.01, swa_epoch_start=2, annealing_epochs=3,
                                       annealing_strategy=strategy)
    trainer = quiet_trainer(max_epochs=6, callbacks=[record, swa])
    module = SWARegressor(lr=0.1)
    with count_compiles() as compiles:
        trainer.fit(module, fj.DataLoader(regression_data(n=32), batch_size=16))
    # float32 rates against Lightning's float64 ones
    np.testing.assert_allclose(record.lrs, LIGHTNING_LRS[strategy], rtol=1e-6)
    np.testing.assert_allclose(record.lrs, _swalr(0.1, 0.01, 6, 1, 3, strategy), rtol=1e-6)
    assert (swa.swa_start, swa.swa_end) == (1, 5)
    average = _mean_by_hand([record.starts[e] for e in LIGHTNING_AVERAGED_EPOCHS])
    assert_trees_close(module.variables[0], average, rtol=1e-6, atol=1e-7)
    assert int(trainer.state.extras["swa"]["n_averaged"]) == 5
    # the rate is a value of the state: one train step and one epoch-start program for 6 epochs
    assert compiles["train_step"] == 1 and compiles["pieces_epoch_start"] == 1, compiles


@pytest.mark.parametrize("strategy", ["single", "dp", "fsdp"])
def test_average_by_hand_with_accumulation_bf16_clipping_and_steps_per_execution(strategy):
    record = EpochRecord()
    strategy_obj = FSDP(min_size_to_shard=8) if strategy == "fsdp" else strategy
    trainer = quiet_trainer(max_epochs=5, strategy=strategy_obj, accumulate_grad_batches=2,
                            precision="bf16-mixed", gradient_clip_val=0.5, steps_per_execution=2,
                            callbacks=[record, fj.StochasticWeightAveraging(0.02, swa_epoch_start=0.6,
                                                                            annealing_epochs=1)])
    module = SWARegressor(lr=0.05)
    trainer.fit(module, fj.DataLoader(regression_data(n=128), batch_size=16))
    # float: int(5 * 0.6) = 3 -> epochs 2, 3, 4 (0-based) averaged at their starts
    average = _mean_by_hand(record.starts[2:5])
    assert_trees_close(trainer.state.params, average, rtol=1e-6, atol=1e-7)
    assert_trees_close(module.variables[0], average, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(record.lrs, [0.05, 0.05, 0.05, 0.02, 0.02], rtol=1e-6)
    swa_state = trainer.state.extras["swa"]
    for avg, p in zip(jax.tree.leaves(swa_state["average"]), jax.tree.leaves(trainer.state.params)):
        assert avg.sharding.is_equivalent_to(p.sharding, p.ndim)
    if strategy == "fsdp":
        assert any(not a.sharding.is_fully_replicated for a in jax.tree.leaves(swa_state["average"]))


def test_a_custom_avg_fn_and_no_annealing():
    record = EpochRecord()
    swa = fj.StochasticWeightAveraging(0.02, swa_epoch_start=2, annealing_epochs=0,
                                       avg_fn=lambda avg, p, n: 0.25 * avg + 0.75 * p)
    trainer = quiet_trainer(max_epochs=4, callbacks=[record, swa])
    module = SWARegressor(lr=0.05)
    trainer.fit(module, fj.DataLoader(regression_data(n=32), batch_size=16))
    np.testing.assert_allclose(record.lrs, [0.05, 0.02, 0.02, 0.02], rtol=1e-6)  # torch's anneal_epochs=0
    expected = jax.tree.map(lambda p: np.asarray(p, np.float32), record.starts[1])  # the first one is copied
    for start in record.starts[2:]:
        expected = jax.tree.map(lambda a, p: 0.25 * a + 0.75 * p, expected, start)
    assert_trees_close(module.variables[0], expected, rtol=1e-6, atol=1e-7)


def test_a_schedule_is_overridden_from_the_start_epoch():
    record = EpochRecord()
    trainer = quiet_trainer(max_epochs=4, callbacks=[record, fj.StochasticWeightAveraging(
        0.01, swa_epoch_start=2, annealing_epochs=2, annealing_strategy="linear")])
    trainer.fit(SWARegressor(lr=0.1, schedule=True), fj.DataLoader(regression_data(n=64), batch_size=16))
    # SWA starts at epoch 1 (0-based) from the rate the state held then: the last update's (step 3),
    # and the schedule no longer moves it
    lr0 = 0.1 * (1 - 3 / 1000)
    np.testing.assert_allclose(record.lrs, [0.1, lr0, 0.5 * 0.01 + 0.5 * lr0, 0.01], rtol=1e-6)


class ScheduleAttribute(SWARegressor):
    """`SWARegressor(schedule=True)`'s optimizer, its rate reached through the module's `lr_schedule`."""

    def __init__(self, lr: float = 0.1, follows: bool = True):
        super().__init__(lr=lr, schedule=True)
        self.follows = follows
        self.lr_schedule = optax.linear_schedule(lr, 0.0, 1000)

    def configure_optimizer(self):
        return optax.sgd(self.lr_schedule if self.follows else self.hparams.lr, momentum=0.9)


def test_the_rate_through_the_modules_lr_schedule_equals_inject_hyperparams_under_fsdp():
    """The same schedule and SWA, with the rate in an `inject_hyperparams` state or in the module's
    `lr_schedule`: the same rates, the same average and parameters (the rescaled update differs
    from the one made at the SWA rate by float32 rounding: rtol 1e-5)."""
    runs = []
    for module in (SWARegressor(lr=0.1, schedule=True), ScheduleAttribute(lr=0.1)):
        trainer = quiet_trainer(max_epochs=4, strategy=FSDP(min_size_to_shard=8), callbacks=[fj.StochasticWeightAveraging(
            0.01, swa_epoch_start=2, annealing_epochs=2, annealing_strategy="linear")])
        with count_compiles() as compiles:
            trainer.fit(module, fj.DataLoader(regression_data(n=64), batch_size=16))
        assert compiles["train_step"] == 1, compiles
        runs.append((jax.device_get(trainer.state.extras["swa"]), jax.device_get(module.variables[0])))
    (injected, injected_params), (attribute, attribute_params) = runs
    # the last update before epoch 1 is step 3: lr0 = schedule(3), as the injected state holds it
    assert float(attribute["lr0"]) == float(injected["lr0"]) == pytest.approx(0.1 * (1 - 3 / 1000), rel=1e-6)
    assert float(attribute["lr"]) == float(injected["lr"]) == pytest.approx(0.01, rel=1e-6)
    assert_trees_close(attribute["average"], injected["average"], rtol=1e-5, atol=1e-7)
    assert_trees_close(attribute_params, injected_params, rtol=1e-5, atol=1e-7)


class LightningStyle(fj.LitModule):
    """Written the Lightning way, with an `lr_scheduler` stepping every batch (fitjax drives the
    `inject_hyperparams` optimizer's rate from it inside each update)."""

    def __init__(self):
        super().__init__()
        self.model = MLP(batchnorm=False)

    def training_step(self, batch, batch_idx):
        return ((self.model(batch["x"], train=True) - batch["y"]) ** 2).mean()

    def configure_optimizers(self):
        return {"optimizer": optax.inject_hyperparams(optax.sgd)(learning_rate=0.1),
                "lr_scheduler": {"scheduler": optax.linear_schedule(0.1, 0.0, 1000), "interval": "step"}}


def test_a_lightning_lr_scheduler_is_swapped_out_from_the_start_epoch():
    record = EpochRecord()
    trainer = quiet_trainer(max_epochs=4, callbacks=[record, fj.StochasticWeightAveraging(
        0.01, swa_epoch_start=3, annealing_epochs=1, annealing_strategy="linear")])
    trainer.fit(LightningStyle(), fj.DataLoader(regression_data(n=64), batch_size=16))
    # the scheduler's rates at steps 0 and 4, then SWA (from epoch 2) from the last update's (step 7)
    np.testing.assert_allclose(record.lrs, [0.1, 0.1 * (1 - 4 / 1000), 0.1 * (1 - 7 / 1000), 0.01], rtol=1e-6)


@pytest.mark.parametrize("cut", [10, 8], ids=["mid-epoch", "epoch-boundary"])
def test_resume_from_a_mid_swa_checkpoint_equals_an_uninterrupted_run_bitwise(tmp_path, cut):
    def fit(folder, max_steps=None, ckpt_path=None):
        swa = fj.StochasticWeightAveraging(0.01, swa_epoch_start=2, annealing_epochs=2)
        trainer = quiet_trainer(max_epochs=5, max_steps=max_steps, strategy="dp", enable_checkpointing=True,
                                callbacks=[swa, fj.ModelCheckpoint(folder, every_n_train_steps=cut // 2)])
        trainer.fit(SWARegressor(batchnorm=True), fj.DataLoader(regression_data(n=64), batch_size=16,
                                                                shuffle=True), ckpt_path=ckpt_path)
        return trainer

    full = fit(tmp_path / "full")
    cut_run = fit(tmp_path / "cut", max_steps=cut)
    # stopped in epoch 2 (averaged at the starts of epochs 1 and 2) or at the end of epoch 1
    assert int(cut_run.state.extras["swa"]["n_averaged"]) == (2 if cut == 10 else 1)
    # stopped before the last epoch (max_steps): like Lightning, the parameters stay the trained ones
    cut_params, cut_average = jax.device_get((cut_run.state.params, cut_run.state.extras["swa"]["average"]))
    assert not all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(cut_params), jax.tree.leaves(cut_average)))
    resumed = fit(tmp_path / "cut", ckpt_path="last")
    assert_trees_close(resumed.state.extras, full.state.extras, rtol=0, atol=0)
    assert_trees_close(resumed.state.params, full.state.params, rtol=0, atol=0)
    assert_trees_close(resumed.state.model_state, full.state.model_state, rtol=0, atol=0)


class LastParams(fj.Callback):
    def on_train_epoch_end(self, trainer, module):
        self.params = jax.device_get(trainer.state.params)


def test_validate_test_and_predict_after_fit_use_the_average():
    data = fj.DataLoader(regression_data(n=64), batch_size=16)
    val = fj.DataLoader(regression_data(n=32, seed=1), batch_size=16)
    last = LastParams()
    trainer = quiet_trainer(max_epochs=3, callbacks=[last, fj.StochasticWeightAveraging(0.01, swa_epoch_start=1)])
    module = SWARegressor()
    trainer.fit(module, data, val)
    average = trainer.state.extras["swa"]["average"]
    assert_trees_close(module.variables[0], average, rtol=0, atol=0)
    fresh = SWARegressor()
    set_variables(fresh, jax.device_get(average), {})
    assert trainer.validate(module, val)[0]["val/loss"] == quiet_trainer().validate(fresh, val)[0]["val/loss"]
    assert trainer.test(module, val)[0]["test/loss"] == quiet_trainer().test(fresh, val)[0]["test/loss"]
    np.testing.assert_array_equal(trainer.predict(module, val), quiet_trainer().predict(fresh, val))
    # and not the last epoch's weights
    trained = SWARegressor()
    set_variables(trained, last.params, {})
    assert quiet_trainer().validate(trained, val)[0]["val/loss"] != trainer.validate(module, val)[0]["val/loss"]


class NNXNet(nnx.Module):
    def __init__(self):
        self.dense = nnx.Linear(8, 16, rngs=nnx.Rngs(0))
        self.bn = nnx.BatchNorm(16, momentum=0.9, rngs=nnx.Rngs(0))
        self.out = nnx.Linear(16, 1, rngs=nnx.Rngs(1))

    def __call__(self, x):
        return self.out(nnx.relu(self.bn(self.dense(x))))


class NNXRegressor(SWARegressor):
    def __init__(self):
        super().__init__()
        self.model = NNXNet()

    def loss(self, model, batch):
        pred = model(batch["x"])
        return ((pred - batch["y"]) ** 2).mean(), {"pred": pred}

    def predict_step(self, model, batch):
        return model(batch["x"])


def _batch_stats_by_hand(x, kernel, bias, batch_size):
    """Mean over batches of each batch's mean and (biased, as flax stores it) variance of the
    BatchNorm's input `x @ kernel + bias`."""
    hs = [x[i:i + batch_size] @ kernel + bias for i in range(0, len(x), batch_size)]
    return np.mean([h.mean(0) for h in hs], 0), np.mean([h.var(0) for h in hs], 0)


@pytest.mark.parametrize("kind", ["linen", "nnx"])
def test_batchnorm_statistics_are_recomputed_with_the_average(kind):
    data = regression_data(n=64)
    module = SWARegressor(batchnorm=True) if kind == "linen" else NNXRegressor()
    trainer = quiet_trainer(max_epochs=3, strategy="dp", callbacks=[fj.StochasticWeightAveraging(
        0.01, swa_epoch_start=1)])
    trainer.fit(module, fj.DataLoader(data, batch_size=16))
    params, model_state = jax.device_get(trainer.state.params), jax.device_get(trainer.state.model_state)
    if kind == "linen":
        dense, stats = params["Dense_0"], model_state["batch_stats"]["BatchNorm_0"]
        mean, var = _batch_stats_by_hand(data["x"], dense["kernel"], dense["bias"], 16)
    else:
        dense, stats = params["dense"], model_state["bn"]
        mean, var = _batch_stats_by_hand(data["x"], dense["kernel"], dense["bias"], 16)
    # rtol: float32 rounding of flax's one-pass variance and of the division by 1 - momentum
    # (measured: at most 8e-7); the trained running statistics (momentum 0.9) are far from these
    np.testing.assert_allclose(stats["mean"], mean, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(stats["var"], var, rtol=1e-5, atol=1e-7)
    assert_trees_close(module.variables[1], model_state, rtol=0, atol=0)  # the module has them too


def test_bad_arguments_name_themselves():
    for kwargs, match in [
        ({"swa_lrs": 0.1, "swa_epoch_start": 0}, r"swa_epoch_start=...\).*got 0"),
        ({"swa_lrs": 0.1, "swa_epoch_start": 1.5}, r"swa_epoch_start=...\).*got 1.5"),
        ({"swa_lrs": -1.0}, r"swa_lrs=...\).*positive.*got -1.0"),
        ({"swa_lrs": "0.1"}, r"swa_lrs=...\).*got '0.1'"),
        ({"swa_lrs": [0.1, 0.2]}, r"swa_lrs=...\) got 2 learning rates"),
        ({"swa_lrs": 0.1, "annealing_epochs": -1}, r"annealing_epochs=...\).*got -1"),
        ({"swa_lrs": 0.1, "annealing_strategy": "step"}, r"annealing_strategy=...\) got 'step'.*'cos', 'linear'"),
        ({"swa_lrs": 0.1, "avg_fn": 3}, r"avg_fn=...\).*got 3"),
    ]:
        with pytest.raises(ValueError, match=match):
            fj.StochasticWeightAveraging(**kwargs)


def test_an_optimizer_without_an_exposed_learning_rate_is_refused_with_the_fix():
    data = fj.DataLoader(regression_data(n=32), batch_size=16)
    trainer = quiet_trainer(max_epochs=2, callbacks=[fj.StochasticWeightAveraging(0.01)])
    with pytest.raises(ValueError, match=r"inject_hyperparams or the module's lr_schedule.*holds 0.*"
                                         r"optax.inject_hyperparams\(optax.adam\).*self\.lr_schedule = "):
        trainer.fit(Regressor(batchnorm=False), data)  # optax.sgd(lr): the rate is in a closure
    trainer = quiet_trainer(max_epochs=2, callbacks=[fj.StochasticWeightAveraging(0.01)])
    with pytest.raises(ValueError, match=r"lr_schedule=<function .*does not follow it"):
        trainer.fit(ScheduleAttribute(follows=False), data)  # has an lr_schedule, built without it
    trainer = quiet_trainer(max_steps=4, max_epochs=-1, callbacks=[fj.StochasticWeightAveraging(0.01)])
    with pytest.raises(ValueError, match=r"needs Trainer\(max_epochs=...\)"):
        trainer.fit(SWARegressor(), data)
