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


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(enable_checkpointing="no"), ValueError, r"enable_checkpointing=\.\.\.\) must be True or False, got 'no'"),
    (dict(enable_progress_bar=0), ValueError, r"enable_progress_bar=\.\.\.\) must be True or False, got 0"),
    (dict(enable_model_summary=None), ValueError, r"enable_model_summary=\.\.\.\) must be True or False, got None"),
    (dict(detect_anomaly=2), ValueError, r"detect_anomaly=\.\.\.\) must be True or False, got 2"),
    (dict(log_grad_norm="yes"), ValueError, r"log_grad_norm=\.\.\.\) must be True or False, got 'yes'"),
    (dict(seed=2**70), ValueError, r"seed=\.\.\.\) must be an int from -2\*\*63 to 2\*\*63 - 1 .*got 1180591620717411303424"),
    (dict(seed=True), ValueError, r"seed=\.\.\.\) must be an int .*got True"),
    (dict(default_root_dir=5), TypeError, r"default_root_dir=\.\.\.\) takes a folder path .*got int: 5"),
    (dict(callbacks="progress"), TypeError, r"callbacks=\.\.\.\) takes a fitjax.Callback or a list of them, got str: 'progress'"),
    (dict(callbacks=5), TypeError, r"callbacks=\.\.\.\) takes a fitjax.Callback or a list of them, got int: 5"),
])
def test_every_trainer_argument_is_checked_when_the_trainer_is_made(kwargs, error, message):
    with pytest.raises(error, match=message):
        fj.Trainer(**kwargs)


def test_one_callback_is_a_list_of_it_as_in_lightning():
    """Lightning's `Trainer(callbacks=cb)` takes one callback as well as a list."""
    stopper = fj.EarlyStopping("val/loss")
    assert stopper in fj.Trainer(callbacks=stopper, logger=False).callbacks


def test_a_default_root_dir_fit_cannot_write_into_is_refused_at_once(tmp_path):
    (tmp_path / "a_file").write_text("")
    with pytest.raises(ValueError, match=r"default_root_dir='.*a_file/runs'\) is not a folder fit can write "
                                         r"into: '.*a_file' is a file"):
        fj.Trainer(default_root_dir=str(tmp_path / "a_file" / "runs"))
    trainer = fj.Trainer(default_root_dir=tmp_path / "new" / "runs", enable_progress_bar=False)
    assert trainer.default_root_dir == str(tmp_path / "new" / "runs")
    assert not (tmp_path / "new").exists()  # checked, not left behind: the loggers create it


@pytest.mark.parametrize("returns, message", [
    ("loss", r"Odd.loss must return a scalar float loss \(or `\(loss, outputs\)`\), got str: 'abc'"),
    ("metrics", r"Odd.metrics must return a dict of name -> scalar, got str: 'abc'"),
    ("metric", r"Odd.metrics\(\)\['acc'\] must be one scalar array per batch, got str: 'abc'"),
])
def test_a_str_from_loss_or_metrics_names_the_method(returns, message):
    class Odd(_Base):
        def loss(self, model, batch):
            return "abc" if returns == "loss" else super().loss(model, batch)

        def metrics(self, batch, outputs):
            return {"metrics": "abc", "metric": {"acc": "abc"}}.get(returns)

    with pytest.raises((TypeError, ValueError), match=message):
        quiet_trainer(max_steps=1, strategy="single").fit(Odd(), _loader())


def _features(d, n=64):
    return fj.DataLoader(regression_data(n=n, d=d), batch_size=32)


class _Mixed:
    """Train batches whose second has another feature size."""

    def __len__(self):
        return 2

    def __iter__(self):
        yield regression_data(n=32, d=8)
        yield regression_data(n=32, d=5)


def test_a_batch_shaped_unlike_the_first_names_its_data_and_index():
    built = r"is shaped unlike the first train batch, which the model and its steps were built from: " \
            r"`batch\['x'\]` has shape \(32, 5\), in the first train batch \(32, 8\)"
    with pytest.raises(ValueError, match=r"the validation data's batch 0 failed in the step and " + built):
        quiet_trainer(max_steps=1, strategy="single").fit(_Base(), _features(8), _features(5))
    with pytest.raises(ValueError, match=r"the train data's batch 1 \(epoch 0\) failed in the step and " + built):
        quiet_trainer(max_epochs=1, strategy="single").fit(_Base(), _Mixed())
    trainer, module = quiet_trainer(max_steps=1, strategy="single"), _Base()
    trainer.fit(module, _features(8))
    with pytest.raises(ValueError, match=r"the test data's batch 0 failed in the step and " + built):
        trainer.test(module, _features(5))
