"""Bad input gets one clear error at the boundary: what was received, what is allowed, the fix."""

from __future__ import annotations

import inspect
from pathlib import Path

import flax.linen as nn
import numpy as np
import optax
import pytest
from helpers import DenseRegression, count_compiles, quiet_trainer, regression_data

import fitjax as fj


def _loader(n=64, batch_size=32):
    return fj.DataLoader(regression_data(n=n), batch_size=batch_size)


_Base = DenseRegression  # the smallest module (tests/helpers.py)


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


def test_dict_batch_predict_needs_predict_step():
    class NoPredict(_Base):
        pass

    with pytest.raises(NotImplementedError, match=r"Override `predict_step\(self, model, batch\)`"):
        quiet_trainer(strategy="single").predict(NoPredict(), _loader())


# One bad value (at least) per `Trainer` argument, with the error it gets when the Trainer is made:
# the argument named, the value received, what is allowed. A new argument needs its row here.
BAD_ARGUMENTS = {
    "max_epochs": [(-3, ValueError, r"max_epochs=\.\.\.\) must be an int >= 0, -1 \(no limit\) or None, got -3"),
                   (1.5, ValueError, r"max_epochs=\.\.\.\) must be an int >= 0, .*got 1.5")],
    "max_steps": [(True, ValueError, r"max_steps=\.\.\.\) must be an int >= 0, -1 \(no limit\) or None, got True")],
    "max_time": [("x", ValueError, r"max_time=\.\.\.\)='x' is not a valid duration: expected a string 'DD:HH:MM:SS'")],
    "min_epochs": [(-2, ValueError, r"min_epochs=\.\.\.\) must be an int >= 0 or None, got -2")],
    "min_steps": [("1", ValueError, r"min_steps=\.\.\.\) must be an int >= 0 or None, got '1'")],
    "accelerator": [("x", ValueError, r"accelerator=\.\.\.\) must be one of 'auto', 'cpu', 'gpu', 'tpu', 'cuda'; got 'x'")],
    "strategy": [("x", ValueError, r"strategy=\.\.\.\) got 'x'; use one of \['auto', 'plan', 'ddp', 'dp', 'fsdp', 'runs', 'single', 'zero1'\]")],
    "remat": [("x", ValueError, r"remat=\.\.\.\) got 'x'; use one of \['none', 'full', 'dots', 'offload'\]")],
    "offload": [("x", ValueError, r"offload=\.\.\.\) got 'x'; use one of \['none', 'optimizer', 'optimizer\+master'\]")],
    "update_in_backward": [("yes", ValueError, r"update_in_backward=\.\.\.\) must be True or False, got 'yes'")],
    "runs": [(0, ValueError, r"runs=\.\.\.\) must be at least 1, got 0"),
             ("x", TypeError, r"runs=\.\.\.\) takes a number of runs .*got 'x'")],
    "devices": [(99, ValueError, r"devices=99\) asks for more devices than the 8 available"),
                ("x", ValueError, r"devices=\.\.\.\) takes 'auto', a positive int or a list of jax devices, got 'x'")],
    "num_nodes": [(0, ValueError, r"num_nodes=\.\.\.\) must be a positive int \(machines\) or None .*got 0")],
    "plugins": [(5, ValueError, r"plugins=\.\.\.\) got 5; fitjax takes cluster environments there")],
    "callbacks": [("progress", TypeError, r"callbacks=\.\.\.\) takes a fitjax.Callback or a list of them, got str: 'progress'"),
                  (5, TypeError, r"callbacks=\.\.\.\) takes a fitjax.Callback or a list of them, got int: 5"),
                  (["progress"], TypeError, r"callbacks=\.\.\.\) items must be fitjax.Callback instances, got str")],
    "logger": [("yes", TypeError, r"logger=\.\.\.\)` must be True .*got 'yes' \(str\)")],
    "default_root_dir": [(5, TypeError, r"default_root_dir=\.\.\.\) takes a folder path .*got int: 5")],
    "log_every_n_steps": [(0, ValueError, r"log_every_n_steps=\.\.\.\) must be a positive int or None, got 0")],
    "val_check_interval": [(1.5, ValueError, r"val_check_interval=\.\.\.\) takes an int number of train batches, "
                                            r"a float fraction of an epoch in \(0, 1\] or a duration .*got 1.5"),
                           ("1", ValueError, r"val_check_interval=\.\.\.\)='1' is not a valid duration: expected a "
                                             r"string 'DD:HH:MM:SS'")],
    "check_val_every_n_epoch": [(0, ValueError, r"check_val_every_n_epoch=\.\.\.\) must be a positive int or None, got 0")],
    **{f"limit_{stage}_batches": [(1.5, ValueError, rf"limit_{stage}_batches=\.\.\.\) takes an int number of batches "
                                                    r"or a float fraction in \[0, 1\], got 1.5")]
       for stage in ("train", "val", "test", "predict")},
    "overfit_batches": [(-1, ValueError, r"overfit_batches=\.\.\.\) takes an int number of batches or a float fraction "
                                         r"in \[0, 1\], got -1")],
    "reload_dataloaders_every_n_epochs": [(-1, ValueError, r"reload_dataloaders_every_n_epochs=\.\.\.\) must be an "
                                                           r"int >= 0 or None, got -1")],
    "num_sanity_val_steps": [(-5, ValueError, r"num_sanity_val_steps=\.\.\.\) must be an int >= -1 .*got -5")],
    "fast_dev_run": [(-1, ValueError, r"fast_dev_run=\.\.\.\) takes a bool or an int >= 0 .*got -1")],
    # a str or an int is not a bool: "no" and 2 would read as True
    **{flag: [("no", ValueError, rf"{flag}=\.\.\.\) must be True or False, got 'no'"),
              (2, ValueError, rf"{flag}=\.\.\.\) must be True or False, got 2"),
              (None, ValueError, rf"{flag}=\.\.\.\) must be True or False, got None")]
       for flag in ("enable_progress_bar", "enable_model_summary", "enable_checkpointing", "log_grad_norm",
                    "detect_anomaly", "deterministic")},
    # Lightning's flags with no JAX meaning: booleans too (None is Lightning's default for benchmark)
    **{flag: [("no", ValueError, rf"{flag}=\.\.\.\) must be True or False, got 'no'"),
              (2, ValueError, rf"{flag}=\.\.\.\) must be True or False, got 2")]
       for flag in ("benchmark", "inference_mode", "sync_batchnorm", "use_distributed_sampler")},
    "seed": [(2**70, ValueError, r"seed=\.\.\.\) must be an int from -2\*\*63 to 2\*\*63 - 1 .*got 1180591620717411303424"),
             (True, ValueError, r"seed=\.\.\.\) must be an int .*got True")],
    "precision": [("x", ValueError, r"precision=\.\.\.\) got 'x'; use one of \['32-true', 'bf16-mixed', .*\] \(Lightning's names\)")],
    "accumulate_grad_batches": [(0, ValueError, r"accumulate_grad_batches=\.\.\.\) must be a positive int, got 0")],
    "compile_cache": [(3, ValueError, r"compile_cache=\.\.\.\) takes True \(fitjax's folder, .*\), False \(off\) or a "
                                      r"folder, got 3"),
                      ("", ValueError, r"compile_cache=\.\.\.\) takes True .*got ''")],
    "gradient_clip_val": [("a", ValueError, r"gradient_clip_val=\.\.\.\) must be a positive number or None, got 'a'")],
    "gradient_clip_algorithm": [("x", ValueError, r"gradient_clip_algorithm=\.\.\.\) got 'x'; use one of \['norm', 'value'\]")],
    "steps_per_execution": [(True, ValueError, r"steps_per_execution=\.\.\.\) must be a positive int, got True")],
    "profiler": [(5, ValueError, r"profiler=\.\.\.\) must be None, 'simple' .*got 5")],
}


@pytest.mark.parametrize("name, value, error, message", [
    pytest.param(name, value, error, message, id=f"{name}={value!r}")
    for name, rows in BAD_ARGUMENTS.items() for value, error, message in rows])
def test_every_trainer_argument_is_checked_when_the_trainer_is_made(name, value, error, message):
    with pytest.raises(error, match=message):
        fj.Trainer(**{name: value})


def test_every_trainer_argument_has_a_bad_value_in_the_table():
    arguments = set(inspect.signature(fj.Trainer.__init__).parameters) - {"self"}
    assert set(BAD_ARGUMENTS) == arguments, (
        f"Trainer arguments without a row in BAD_ARGUMENTS (check them in fitjax/loop/_checks.py): "
        f"{sorted(arguments - set(BAD_ARGUMENTS))}; rows of no argument: {sorted(set(BAD_ARGUMENTS) - arguments)}")


@pytest.mark.parametrize("call, error, message", [
    (lambda t: t.fit(5, _loader()), TypeError, r"Trainer.fit\(module=\.\.\.\) expected a fitjax.LitModule, got int: 5"),
    (lambda t: t.test(5, _loader()), TypeError, r"Trainer.test\(module=\.\.\.\) expected a fitjax.LitModule, got int: 5"),
    (lambda t: t.fit(_Base(), 5), TypeError, r"`train_data` must be a fj.DataLoader, .*received 5"),
    (lambda t: t.fit(_Base(), _loader(), 5), TypeError, r"`val_data` must be a fj.DataLoader, .*received 5"),
    (lambda t: t.fit(_Base(), datamodule=5), TypeError, r"Trainer.fit\(datamodule=\.\.\.\) takes a fj.DataModule .*got int: 5"),
    (lambda t: t.validate(_Base(), datamodule="dm"), TypeError,
     r"Trainer.validate\(datamodule=\.\.\.\) takes a fj.DataModule .*got str: 'dm'"),
    (lambda t: t.fit(_Base(), _loader(), ckpt_path=5), TypeError, r"Trainer.fit\(ckpt_path=\.\.\.\) takes 'last', 'best' or a checkpoint path; got 5"),
    (lambda t: t.validate(_Base(), _loader(), verbose=2), TypeError, r"Trainer.validate\(verbose=\.\.\.\) takes True or False, got 2"),
    (lambda t: t.save_checkpoint(5), TypeError, r"Trainer.save_checkpoint\(filepath=\.\.\.\) takes a checkpoint folder path .*got int: 5"),
], ids=["fit-module", "test-module", "train_data", "val_data", "fit-datamodule", "validate-datamodule", "ckpt_path",
        "verbose", "save_checkpoint"])
def test_the_stage_methods_check_their_arguments_before_running(call, error, message):
    trainer = quiet_trainer(max_steps=1, strategy="single")
    with pytest.raises(error, match=message):
        call(trainer)
    assert trainer.state is None  # refused before anything was built


def test_one_callback_is_a_list_of_it_as_in_lightning():
    """Lightning's `Trainer(callbacks=cb)` takes one callback as well as a list."""
    stopper = fj.EarlyStopping("val/loss")
    assert stopper in fj.Trainer(callbacks=stopper, logger=False).callbacks


def test_a_default_root_dir_fit_cannot_write_into_is_refused_at_once(tmp_path):
    (tmp_path / "a_file").write_text("")
    with pytest.raises(ValueError, match=r"default_root_dir='.*a_file/runs'\) is not a folder fit can write "
                                         r"into: '.*a_file' is a file"):
        fj.Trainer(default_root_dir=str(tmp_path / "a_file" / "runs"))
    if Path("/proc/self").is_dir():  # a folder no one can create (even root): in /proc, on Linux
        with pytest.raises(ValueError, match=r"default_root_dir='/proc/fitjax_runs'\) is not a folder fit can "
                                             r"write into: creating it fails \(FileNotFoundError"):
            fj.Trainer(default_root_dir="/proc/fitjax_runs")
    trainer = fj.Trainer(default_root_dir=tmp_path / "new" / "runs", enable_progress_bar=False)
    assert trainer.default_root_dir == str(tmp_path / "new" / "runs")
    assert not (tmp_path / "new").exists()  # checked, not left behind: the loggers create it


@pytest.mark.parametrize("returns, message", [
    ("loss", r"Odd.loss must return a scalar float loss \(or `\(loss, outputs\)`\), got str: 'abc'.*"
             r"\(Odd.loss is defined at .*test_errors.py:\d+\)"),
    ("metrics", r"Odd.metrics must return a dict of name -> scalar, got str: 'abc' "
                r"\(Odd.metrics is defined at .*test_errors.py:\d+\)"),
    ("metric", r"Odd.metrics\(\)\['acc'\] must be one scalar array per batch \(or a metric, .*\), got str: 'abc' "
               r"\(Odd.metrics is defined at .*test_errors.py:\d+\)"),
])
def test_a_str_from_loss_or_metrics_names_the_method_and_its_file(returns, message):
    """The error names the user's method and where it is, not the fitjax frame that traced it."""
    class Odd(_Base):
        def loss(self, model, batch):
            return "abc" if returns == "loss" else super().loss(model, batch)

        def metrics(self, batch, outputs):
            return {"metrics": "abc", "metric": {"acc": "abc"}}.get(returns)

    with pytest.raises((TypeError, ValueError), match=message) as raised:
        quiet_trainer(max_steps=1, strategy="single").fit(Odd(), _loader())
    assert "forward.py" not in str(raised.value)


@pytest.mark.parametrize("hook", ["training_step", "validation_step"])
def test_a_str_from_a_lightning_step_names_the_hook_and_its_file(hook):
    class Odd(fj.LitModule):
        def __init__(self):
            super().__init__()
            self.model = nn.Dense(1)

        def training_step(self, batch, batch_idx):
            return "abc" if hook == "training_step" else ((self.model(batch["x"]) - batch["y"]) ** 2).mean()

        def validation_step(self, batch, batch_idx):
            return "abc"

        def configure_optimizers(self):
            return optax.sgd(0.1)

    with pytest.raises(ValueError, match=rf"Odd.{hook} must return the loss .*got str: 'abc' "
                                         rf"\(Odd.{hook} is defined at .*test_errors.py:\d+\)"):
        quiet_trainer(max_steps=1, strategy="single").fit(Odd(), _loader(), _loader())


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
    stacked = built.replace(r"\(32, 5\)", r"\(32, 5\) \(stacked as \(2, 32, 5\)\)")  # the micro-batches
    with pytest.raises(ValueError, match=r"the train data's batch 1 \(epoch 0\) failed in the step and " + stacked):
        quiet_trainer(max_epochs=1, strategy="single", accumulate_grad_batches=2).fit(_Base(), _Mixed())
    trainer, module = quiet_trainer(max_steps=1, strategy="single"), _Base()
    trainer.fit(module, _features(8))
    with pytest.raises(ValueError, match=r"the test data's batch 0 failed in the step and " + built):
        trainer.test(module, _features(5))
    with pytest.raises(ValueError, match=r"the predict data's batch 0 failed in the step and " + built):
        trainer.predict(module, _features(5))
