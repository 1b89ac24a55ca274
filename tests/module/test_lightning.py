"""Lightning-shaped modules (`training_step`, `self.log`, `configure_optimizers`, manual
optimization) train through the same jitted step as `loss` / `metrics` modules."""

from __future__ import annotations

import csv

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
from helpers import MLP, LossHistory, Regressor, assert_trees_close, quiet_trainer, regression_data

import fitjax as fj


class LightningRegressor(fj.LitModule):
    """`helpers.Regressor` written the Lightning way."""

    def __init__(self, lr: float = 0.05):
        super().__init__()
        self.save_hyperparameters()
        self.model = MLP()

    def forward(self, x):
        return self.model(x, train=self.training)

    def training_step(self, batch, batch_idx):
        pred = self(batch["x"])
        self.log("train_mae", abs(pred - batch["y"]).mean(), on_step=True, on_epoch=True)
        return {"loss": ((pred - batch["y"]) ** 2).mean()}

    def validation_step(self, batch, batch_idx):
        pred = self(batch["x"])
        self.log_dict({"val_loss": ((pred - batch["y"]) ** 2).mean(), "val_mae": abs(pred - batch["y"]).mean()},
                      sync_dist=True)

    def predict_step(self, batch, batch_idx):
        return self(batch["x"])

    def configure_optimizers(self):
        return optax.sgd(self.hparams.lr, momentum=0.9)


def _fit(module, **kwargs):
    history = LossHistory()
    trainer = quiet_trainer(max_epochs=2, log_every_n_steps=4, callbacks=[history], **kwargs)
    trainer.fit(module, fj.DataLoader(regression_data(), batch_size=32),
                fj.DataLoader(regression_data(n=40, seed=1), batch_size=16))
    return trainer, history.losses


@pytest.mark.parametrize("strategy", ["single", "dp", "fsdp"])
def test_lightning_style_matches_loss_metrics_style_step_for_step(strategy):
    lightning_module, plain_module = LightningRegressor(), Regressor()
    lightning, lightning_losses = _fit(lightning_module, strategy=strategy)
    plain, plain_losses = _fit(plain_module, strategy=strategy)
    assert len(lightning_losses) == 16
    np.testing.assert_allclose(lightning_losses, plain_losses, rtol=1e-6)
    got, want = lightning.logged_metrics, plain.logged_metrics
    pairs = {"train/loss": "train/loss", "train_mae_step": "train/mae", "train_mae_epoch": "train/mae_epoch",
             "val_loss": "val/loss", "val_mae": "val/mae"}
    for key, plain_key in pairs.items():
        assert got[key] == pytest.approx(want[plain_key], rel=1e-5), key
    data = fj.DataLoader(regression_data(n=20, seed=2), batch_size=8)
    np.testing.assert_allclose(lightning.predict(lightning_module, data),
                               plain.predict(plain_module, data), rtol=1e-5)


class Keys(LightningRegressor):
    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)["loss"]
        self.log("default", loss)  # on_step=True, on_epoch=False
        self.log("epoch_only", loss, on_step=False, on_epoch=True)
        self.log("both", loss, on_epoch=True)
        self.log("idx", batch_idx.astype(jnp.float32))
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_default", batch_idx.astype(jnp.float32))  # on_epoch=True
        self.log("val_both", 1.0 + 0 * batch_idx, on_step=True, on_epoch=True)

    def test_step(self, batch, batch_idx):
        self.log("test_only", 2.0 + 0 * batch_idx)


def test_on_step_on_epoch_key_names_follow_lightning(tmp_path):
    trainer = quiet_trainer(max_epochs=2, log_every_n_steps=4, logger=fj.CSVLogger(tmp_path, name="csv"))
    module = Keys()
    val = fj.DataLoader(regression_data(n=40, seed=1), batch_size=16)  # 3 batches: idx 0, 1, 2
    trainer.fit(module, fj.DataLoader(regression_data(), batch_size=32), val)  # 8 steps/epoch
    with open(tmp_path / "csv" / "version_0" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    logged_at = {key: [int(r["step"]) for r in rows if r[key]] for key in rows[0] if key not in ("step", "epoch")}
    # Lightning's rows: at the index of each window's last step (global_step - 1)
    assert logged_at["default"] == logged_at["both_step"] == logged_at["idx"] == [3, 7, 11, 15]
    assert logged_at["epoch_only"] == logged_at["both_epoch"] == [7, 15]
    assert logged_at["val_default"] == logged_at["val_both_epoch"] == [7, 15]
    assert not {"both", "epoch_only_step", "val_both", "default_epoch", "train/default"} & set(logged_at)
    # batch_idx: the global step in training_step (the window of steps 12..15 averages 13.5),
    # the batch within the evaluation in validation_step (0, 1, 2 with weights 16, 16, 8)
    last = rows[-1]
    assert float(last["idx"]) == pytest.approx(13.5)
    assert float(last["val_default"]) == pytest.approx((0 * 16 + 1 * 16 + 2 * 8) / 40)
    assert trainer.test(module, val) == [{"test_only": 2.0}]  # test_step, not validation_step
    assert trainer.validate(module, val)[0]["val_both_epoch"] == 1.0


def test_self_model_is_the_bound_model_only_inside_the_hooks():
    module = LightningRegressor()
    unbound = module.model
    seen = []

    class Spy(LightningRegressor):
        def training_step(self, batch, batch_idx):
            seen.append(self.model.scope is not None)
            if len(seen) == 2:
                raise RuntimeError("boom")
            return super().training_step(batch, batch_idx)

    spy = Spy()
    with pytest.raises(RuntimeError, match="boom"):
        quiet_trainer(max_steps=2).fit(spy, fj.DataLoader(regression_data(n=64), batch_size=32))
    assert seen[:2] == [True, True] and spy.model.scope is None  # restored after the exception
    quiet_trainer(max_steps=1).fit(module, fj.DataLoader(regression_data(n=64), batch_size=32))
    assert module.model is unbound


class NNXNet(fj.LitModule):
    def __init__(self):
        super().__init__()
        from flax import nnx
        self.model = nnx.Linear(8, 1, rngs=nnx.Rngs(0))

    def training_step(self, batch, batch_idx):
        return ((self(batch["x"]) - batch["y"]) ** 2).mean()

    def configure_optimizers(self):
        return optax.sgd(0.05)


def test_an_nnx_model_trains_in_training_step_and_its_object_is_updated():
    module = NNXNet()
    history = LossHistory()
    quiet_trainer(max_epochs=3, callbacks=[history]).fit(module, fj.DataLoader(regression_data(), batch_size=32))
    assert history.losses[-1] < 0.2 * history.losses[0]
    np.testing.assert_allclose(module.model.kernel[...], module.variables[0]["kernel"])


class Violation(fj.LitModule):
    def __init__(self, bad):
        super().__init__()
        self.model, self.bad = nn.Dense(1), bad

    def training_step(self, batch, batch_idx):
        loss = ((self(batch["x"]) - batch["y"]) ** 2).mean()
        self.bad(loss, batch_idx)
        return loss

    def configure_optimizers(self):
        return optax.sgd(0.01)


@pytest.mark.parametrize("bad, cause, says", [
    (lambda loss, i: loss.item(), jax.errors.ConcretizationTypeError, r"\.item\(\).*jax\.debug\.print"),
    (lambda loss, i: float(loss), jax.errors.ConcretizationTypeError, r"float\(x\).*self\.log"),
    (lambda loss, i: 1 if loss > 1 else 0, jax.errors.TracerBoolConversionError, r"Python `if`.*jnp\.where"),
    (lambda loss, i: 1 if i == 0 else 0, jax.errors.TracerBoolConversionError, r"Python `if`.*jax\.lax\.cond"),
    (lambda loss, i: np.asarray(loss), jax.errors.TracerArrayConversionError, r"NumPy array.*jax\.numpy"),
    (lambda loss, i: [1, 2][i], jax.errors.TracerIntegerConversionError, r"int\(x\).*jnp\.take"),
])
def test_jit_rule_violations_fail_at_the_first_trace_with_the_rule_and_the_fix(bad, cause, says):
    trainer = quiet_trainer(max_steps=1)
    with pytest.raises(TypeError, match=r"Violation\.training_step is traced under jax\.jit.*" + says) as info:
        trainer.fit(Violation(bad), fj.DataLoader(regression_data(n=32), batch_size=32))
    assert isinstance(info.value.__cause__, cause)
    assert trainer.global_step == 0  # raised while tracing, before any step ran


def test_print_of_a_traced_value_is_allowed(capsys):
    quiet_trainer(max_steps=1).fit(Violation(lambda loss, i: print("loss is", loss)),
                                   fj.DataLoader(regression_data(n=32), batch_size=32))
    assert "loss is" in capsys.readouterr().out


class Optimizers(fj.LitModule):
    def __init__(self, returns):
        super().__init__()
        self.model, self.returns = nn.Dense(1), returns

    def training_step(self, batch, batch_idx):
        return ((self(batch["x"]) - batch["y"]) ** 2).mean()

    def configure_optimizers(self):
        return self.returns()


def _fit_optimizers(returns, steps=3):
    trainer = quiet_trainer(max_steps=steps)
    trainer.fit(Optimizers(returns), fj.DataLoader(regression_data(n=64), batch_size=8))
    return trainer.state.opt_state


SCHEDULE = optax.linear_schedule(0.1, 0.0, 10)


@pytest.mark.parametrize("returns", [
    lambda: {"optimizer": optax.sgd, "lr_scheduler": SCHEDULE},
    lambda: {"optimizer": optax.inject_hyperparams(optax.sgd)(learning_rate=1.0),
             "lr_scheduler": {"scheduler": SCHEDULE, "interval": "step"}},
])
def test_an_optax_lr_scheduler_drives_the_learning_rate(returns):
    opt_state = _fit_optimizers(returns, steps=3)
    assert float(opt_state.hyperparams["learning_rate"]) == pytest.approx(float(SCHEDULE(2)))  # the last update's


@pytest.mark.parametrize("returns, error, says", [
    (lambda: {"optimizer": optax.sgd(0.1), "lr_scheduler": SCHEDULE}, TypeError, r"optax\.inject_hyperparams"),
    (lambda: {"optimizer": optax.sgd, "lr_scheduler": {"scheduler": SCHEDULE}}, ValueError,
     r"steps every 1 epoch.*'interval': 'step'"),
    (lambda: [optax.sgd(0.1), optax.adam(0.1)], TypeError, r"which parameters each optimizer updates"),
    (lambda: torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1), TypeError, r"torch SGD.*optax\.sgd"),
    (lambda: {"optimizer": optax.adam(1e-3), "lr_scheduler": torch.optim.lr_scheduler.ReduceLROnPlateau(
        torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1))}, TypeError,
     r"torch ReduceLROnPlateau.*optax\.contrib\.reduce_on_plateau"),
    (lambda: {"optimizer": optax.adam, "lr_scheduler": torch.optim.lr_scheduler.StepLR(
        torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1), step_size=3)}, TypeError,
     r"torch StepLR.*optax\.exponential_decay.*staircase=True"),
    (lambda: {"kernel": optax.sgd(0.1)}, ValueError, r"also hold \['bias'\].*optax\.set_to_zero"),
])
def test_configure_optimizers_forms_that_cannot_map_say_what_to_use(returns, error, says):
    with pytest.raises(error, match=says):
        _fit_optimizers(returns)


def test_reduce_on_plateau_sees_the_training_loss():
    # lr 0 keeps the loss flat: a plateau, so the scale drops after `patience` steps
    opt_state = _fit_optimizers(lambda: optax.chain(optax.sgd(0.0), optax.contrib.reduce_on_plateau(
        factor=0.5, patience=2)), steps=8)
    assert float(opt_state[1].scale) < 1.0


def test_per_group_optimizers_update_each_group_with_its_own_transformation():
    class Frozen(Optimizers):
        def __init__(self):
            super().__init__(lambda: {"kernel": optax.sgd(0.1), "bias": optax.set_to_zero()})

    module, history = Frozen(), LossHistory()
    quiet_trainer(max_epochs=2, callbacks=[history]).fit(module, fj.DataLoader(regression_data(), batch_size=32))
    assert np.all(np.asarray(module.variables[0]["bias"]) == 0)  # Dense's zero init, never updated
    assert history.losses[-1] < 0.2 * history.losses[0]  # while the kernel learns


class TwoGroups(nn.Module):
    def setup(self):
        self.a, self.b = nn.Dense(1), nn.Dense(1)

    def __call__(self, x):
        return self.a(x), self.b(x)


class Manual(fj.LitModule):
    def __init__(self, returns=None):
        super().__init__()
        self.automatic_optimization = False
        self.model, self.returns = TwoGroups(), returns

    def training_step(self, batch, batch_idx):
        a, b = self.model(batch["x"])
        # `a` fits y; `b` fits -y, and its loss also involves `a` (not updated by it)
        losses = {"a": ((a - batch["y"]) ** 2).mean(), "b": ((b + batch["y"] + 0 * a) ** 2).mean()}
        return self.returns(losses) if self.returns else losses

    def configure_optimizers(self):
        return {"a": optax.sgd(0.05), "b": optax.sgd(0.05)}


def test_manual_optimization_updates_each_group_by_its_own_loss():
    module = Manual()
    trainer = quiet_trainer(max_epochs=5)
    data = regression_data()
    trainer.fit(module, fj.DataLoader(data, batch_size=32))
    params = module.variables[0]
    a = data["x"] @ np.asarray(params["a"]["kernel"]) + np.asarray(params["a"]["bias"])
    b = data["x"] @ np.asarray(params["b"]["kernel"]) + np.asarray(params["b"]["bias"])
    assert np.mean((a - data["y"]) ** 2) < 0.05 and np.mean((b + data["y"]) ** 2) < 0.05


def test_manual_optimization_errors_name_the_groups():
    data = fj.DataLoader(regression_data(n=32), batch_size=32)
    with pytest.raises(ValueError, match=r"must return a dict `\{param group: scalar loss\}`"):
        quiet_trainer(max_steps=1).fit(Manual(lambda losses: losses["a"] + losses["b"]), data)
    with pytest.raises(ValueError, match=r"losses for \['c'\].*groups are.*\['a', 'b'\]"):
        quiet_trainer(max_steps=1).fit(Manual(lambda losses: {**losses, "c": losses["a"]}), data)


def test_defining_both_loss_and_training_step_is_an_error():
    class Both(LightningRegressor):
        def loss(self, model, batch):
            return 0.0

    with pytest.raises(TypeError, match=r"Both defines both `loss` and `training_step`.*keep one"):
        quiet_trainer(max_steps=1).fit(Both(), fj.DataLoader(regression_data(n=32), batch_size=32))


def test_lightning_only_log_options_are_accepted_and_unknown_ones_named():
    class Odd(LightningRegressor):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)["loss"]
            self.log("x", loss, logger=True, batch_size=32, rank_zero_only=True, colour="red")
            return loss

    with pytest.raises(TypeError, match=r"Odd.log\('x', \.\.\.\) got unknown options \['colour'\]"):
        quiet_trainer(max_steps=1).fit(Odd(), fj.DataLoader(regression_data(n=32), batch_size=32))


def test_manual_optimization_clips_each_group_by_its_own_norm():
    """`Trainer(gradient_clip_val=...)` under manual optimization clips each parameter group on
    its own (Lightning's `clip_gradients(optimizer, ...)` clips one optimizer's parameters): the
    same numbers as clipping inside each group's optax transformation."""
    class ClippedInside(Manual):
        def configure_optimizers(self):
            return {g: optax.chain(optax.clip_by_global_norm(0.1), optax.sgd(0.05)) for g in ("a", "b")}

    data = fj.DataLoader(regression_data(n=64), batch_size=16)
    by_trainer, inside, unclipped = Manual(), ClippedInside(), Manual()
    quiet_trainer(max_epochs=2, gradient_clip_val=0.1).fit(by_trainer, data)
    quiet_trainer(max_epochs=2).fit(inside, data)
    quiet_trainer(max_epochs=2).fit(unclipped, data)
    assert_trees_close(by_trainer.variables[0], inside.variables[0], rtol=0, atol=0)
    assert not np.allclose(np.asarray(by_trainer.variables[0]["a"]["kernel"]),
                           np.asarray(unclipped.variables[0]["a"]["kernel"]))


def test_lightning_style_trains_with_gradient_clipping_and_accumulation():
    module, history = LightningRegressor(), LossHistory()
    quiet_trainer(max_epochs=3, gradient_clip_val=1.0, accumulate_grad_batches=2, callbacks=[history]).fit(
        module, fj.DataLoader(regression_data(), batch_size=32))
    assert history.losses[-1] < 0.5 * history.losses[0]
