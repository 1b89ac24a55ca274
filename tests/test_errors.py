"""Bad input gets one clear error at the boundary: what was received, what is allowed, the fix."""

from __future__ import annotations

import flax.linen as nn
import numpy as np
import optax
import pytest
from helpers import count_compiles, quiet_trainer, regression_data

import fitjax as fj


def _loader(n=64, batch_size=32):
    return fj.DataLoader(regression_data(n=n), batch_size=batch_size)


class _Base(fj.LitModule):
    def __init__(self):
        super().__init__()
        self.model = nn.Dense(1)

    def loss(self, model, batch):
        return ((model(batch["x"]) - batch["y"]) ** 2).mean()

    def configure_optimizer(self):
        return optax.sgd(0.1)


def test_non_scalar_loss_is_rejected_before_compilation():
    class PerExample(_Base):
        def loss(self, model, batch):
            return (model(batch["x"]) - batch["y"]) ** 2

    with count_compiles() as compiles, pytest.raises(ValueError, match=r"PerExample.loss must return a scalar.*shape \(32, 1\).*\.mean\(\)"):
        quiet_trainer(max_steps=1, strategy="single").fit(PerExample(), _loader())
    assert compiles["train_step"] == 0


def test_non_scalar_metric_is_rejected():
    class BadMetric(_Base):
        def metrics(self, batch, outputs):
            return {"err": batch["y"][:, 0]}

    with pytest.raises(ValueError, match=r"BadMetric.metrics\(\)\['err'\] must be one scalar per batch, got shape \(32,\)"):
        quiet_trainer(max_steps=1, strategy="single").fit(BadMetric(), _loader())


def test_metrics_must_be_a_dict():
    class ListMetric(_Base):
        def metrics(self, batch, outputs):
            return [1.0]

    with pytest.raises(TypeError, match=r"ListMetric.metrics must return a dict"):
        quiet_trainer(max_steps=1, strategy="single").fit(ListMetric(), _loader())


def test_optimizer_must_be_an_optax_transformation():
    class TorchHabit(_Base):
        def configure_optimizer(self):
            return "adam"

    with pytest.raises(TypeError, match=r"TorchHabit.configure_optimizer must return an optax.GradientTransformation.*got str: 'adam'"):
        quiet_trainer(max_steps=1, strategy="single").fit(TorchHabit(), _loader())


def test_unknown_strategy_lists_the_valid_names():
    with pytest.raises(ValueError, match=r"strategy=\.\.\.\) got 'deepspeed'; use one of \['auto', .*'dp'.*'single'"):
        fj.Trainer(strategy="deepspeed")


def test_batch_leaves_disagreeing_on_leading_dim():
    with pytest.raises(ValueError, match=r"\['x'\].*64.*\['y'\].*10"):
        fj.DataLoader({"x": np.zeros((64, 3)), "y": np.zeros((10, 1))}, batch_size=8)

    batches = [{"x": np.zeros((8, 8), np.float32), "y": np.zeros((4, 1), np.float32)}]
    with pytest.raises(ValueError, match=r"\['x'\].*8.*\['y'\].*4"):
        quiet_trainer(max_steps=1, strategy="single").fit(_Base(), batches)


def test_empty_dataset():
    with pytest.raises(ValueError, match="empty"):
        fj.DataLoader({"x": np.zeros((0, 3))}, batch_size=8)
    with pytest.raises(ValueError, match="train_data is empty"):
        quiet_trainer(max_steps=1, strategy="single").fit(_Base(), [])


def test_batch_that_does_not_divide_over_devices_names_both_numbers():
    with pytest.raises(ValueError, match=r"batch size of 12, which does not divide over the 8 devices"):
        quiet_trainer(max_steps=1, strategy="dp", devices=8).fit(_Base(), _loader(n=48, batch_size=12))


def test_raw_arrays_get_a_loader_hint():
    with pytest.raises(TypeError, match=r"fj\.DataLoader\("):
        quiet_trainer(max_steps=1, strategy="single").fit(_Base(), regression_data())


def test_module_without_super_init_or_model():
    class NoSuper(fj.LitModule):
        def __init__(self):
            self.model = nn.Dense(1)

    with pytest.raises(RuntimeError, match=r"super\(\).__init__\(\)"):
        quiet_trainer(max_steps=1, strategy="single").fit(NoSuper(), _loader())

    class NoModel(_Base):
        def __init__(self):
            fj.LitModule.__init__(self)

    with pytest.raises(AttributeError, match=r"assign a flax.linen or flax.nnx module to `self.model`"):
        quiet_trainer(max_steps=1, strategy="single").fit(NoModel(), _loader())

    class TorchModel(_Base):
        def __init__(self):
            fj.LitModule.__init__(self)
            self.model = object()

    with pytest.raises(TypeError, match=r"TorchModel.model must be a flax.linen.Module or a flax.nnx.Module, got object"):
        quiet_trainer(max_steps=1, strategy="single").fit(TorchModel(), _loader())


def test_bad_trainer_arguments_name_the_argument():
    with pytest.raises(ValueError, match=r"max_epochs=\.\.\.\) must be an int >= 0, -1 \(no limit\) or None, got -3"):
        fj.Trainer(max_epochs=-3)
    with pytest.raises(ValueError, match=r"limit_train_batches=\.\.\.\) takes an int number of batches or a float fraction in \[0, 1\], got 1.5"):
        fj.Trainer(limit_train_batches=1.5)
    with pytest.raises(ValueError, match=r"devices=99\) asks for more devices than the 8 available"):
        fj.Trainer(devices=99)
    with pytest.raises(TypeError, match=r"callbacks=\.\.\.\) items must be fitjax.Callback instances, got str"):
        fj.Trainer(callbacks=["progress"])


def test_dict_batch_predict_needs_predict_step():
    class NoPredict(_Base):
        pass

    with pytest.raises(NotImplementedError, match=r"Override `predict_step\(self, model, batch\)`"):
        quiet_trainer(strategy="single").predict(NoPredict(), _loader())
