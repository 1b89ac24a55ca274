"""Lines a Lightning user writes, run unchanged (issue 26): Lightning's argument names, loaders on
the module, `configure_optimizers`' list form, host hooks that call the model, the latest step
values in `callback_metrics`, `seed_everything`, and Lightning's flags with no JAX meaning."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fitjax as fj
from fitjax.module import _optimizers
from helpers import Regressor, assert_trees_close, count_compiles, quiet_trainer, regression_data


def _loader(n=64, seed=0):
    return fj.DataLoader(regression_data(n=n, seed=seed), batch_size=16)


class Data(fj.DataModule):
    def __init__(self):
        self.stages = []

    def setup(self, stage):
        self.stages.append(stage)
        self.train, self.val = regression_data(n=64, seed=0), regression_data(n=32, seed=1)

    def train_dataloader(self):
        return fj.DataLoader(self.train, batch_size=16)

    def val_dataloader(self):
        return fj.DataLoader(self.val, batch_size=16)

    def test_dataloader(self):
        return fj.DataLoader(self.val, batch_size=16)


# ------------------------------------------------------------------ 1, 2: Lightning's argument names

def test_fit_takes_a_datamodule_positionally_and_lightnings_keyword_names():
    dm = Data()
    trainer = quiet_trainer(max_epochs=1)
    trainer.fit(Regressor(), dm)  # Lightning: `trainer.fit(model, dm)`
    assert dm.stages == ["fit"] and trainer.global_step == 4

    module = Regressor()
    trainer = quiet_trainer(max_epochs=1)
    trainer.fit(model=module, train_dataloaders=_loader(), val_dataloaders=_loader(32, seed=1))
    assert trainer.global_step == 4 and "val/loss" in trainer.callback_metrics
    [val] = trainer.validate(model=module, dataloaders=_loader(32, seed=1))
    [test] = trainer.test(module, dm)  # a datamodule where the data goes
    assert val["val/loss"] == pytest.approx(trainer.callback_metrics["val/loss"])
    assert test["test/loss"] == pytest.approx(val["val/loss"])  # the same split
    predictions = trainer.predict(model=module, dataloaders=fj.DataLoader({"x": regression_data(n=20)["x"]}, batch_size=8))
    assert predictions.shape == (20, 1)
    assert trainer.predict(module, _loader(), return_predictions=False) is None


def test_test_without_a_model_uses_the_fitted_one_from_its_best_checkpoint(tmp_path):
    dm = Data()
    best = fj.ModelCheckpoint(monitor="val/loss", mode="min", save_top_k=1)
    trainer = quiet_trainer(max_epochs=3, callbacks=[best], default_root_dir=tmp_path, enable_checkpointing=True)
    module = Regressor()
    trainer.fit(module, datamodule=dm)
    assert trainer.lightning_module is module
    [from_best] = trainer.test(ckpt_path="best", datamodule=dm)  # Lightning's line, no model
    [explicit] = trainer.test(module, datamodule=dm, ckpt_path=best.best_model_path)
    assert from_best == explicit
    with pytest.warns(UserWarning, match="best model of the previous `fit`"):
        [default] = trainer.test(datamodule=dm)  # Lightning: ckpt_path=None -> "best", warned
    assert default == explicit


def test_an_argument_under_both_names_or_no_module_at_all_is_refused():
    trainer = quiet_trainer(max_epochs=1)
    with pytest.raises(TypeError, match="both train_data= and train_dataloaders="):
        trainer.fit(Regressor(), _loader(), train_dataloaders=_loader())
    with pytest.raises(TypeError, match="both module= and model="):
        trainer.validate(Regressor(), model=Regressor(), dataloaders=_loader())
    with pytest.raises(TypeError, match=r"Trainer.test\(\) needs the module.*has run none"):
        quiet_trainer().test(dataloaders=_loader())


# ---------------------------------------------------------------- 3: loaders defined on the module

class SelfFed(Regressor):
    """Lightning's shape of imagenet.py: the module holds its data and loaders."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def prepare_data(self):
        self.calls.append("prepare_data")

    def setup(self, stage):
        self.calls.append(f"setup:{stage}")
        self.train_split, self.val_split = regression_data(n=64, seed=0), regression_data(n=32, seed=1)

    def train_dataloader(self):
        return fj.DataLoader(self.train_split, batch_size=16)

    def val_dataloader(self):
        return fj.DataLoader(self.val_split, batch_size=16)


def test_a_module_with_its_own_loaders_and_setup_fits_and_validates_without_data():
    module = SelfFed()
    trainer = quiet_trainer(max_epochs=2, num_sanity_val_steps=0)
    trainer.fit(module)
    assert trainer.global_step == 8 and "val/loss" in trainer.callback_metrics
    [val] = trainer.validate(module)
    assert module.calls == ["prepare_data", "setup:fit", "prepare_data", "setup:validate"]
    assert val["val/loss"] == pytest.approx(trainer.callback_metrics["val/loss"])
    with pytest.raises(ValueError, match="`test_dataloader\\(\\)` method on SelfFed"):
        trainer.test(module)
    # data passed explicitly wins over the module's own (Lightning's order)
    trainer = quiet_trainer(max_epochs=1)
    trainer.fit(SelfFed(), fj.DataLoader(regression_data(n=32), batch_size=16))
    assert trainer.global_step == 2


# ------------------------------------- 4: configure_optimizers' list form, a chain with a schedule

_SCHEDULE = optax.cosine_decay_schedule(0.1, decay_steps=8)


class TorchShaped(Regressor):
    """`torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-4)` + `CosineAnnealingLR`,
    returned as Lightning's `[optimizer], [scheduler]`."""

    def configure_optimizers(self):
        optimizer = optax.chain(optax.add_decayed_weights(1e-4),
                                optax.inject_hyperparams(optax.sgd)(learning_rate=0.1, momentum=0.9))
        return [optimizer], [{"scheduler": _SCHEDULE, "interval": "step"}]

    configure_optimizer = fj.LitModule.configure_optimizer  # Regressor's own would win


class Reference(Regressor):
    def configure_optimizer(self):  # the same update with the schedule as optax's learning rate
        return optax.chain(optax.add_decayed_weights(1e-4), optax.sgd(_SCHEDULE, momentum=0.9))


def test_lists_of_one_optimizer_and_one_scheduler_drive_an_injected_rate_inside_a_chain():
    ported, reference = TorchShaped(), Reference()
    for module in (ported, reference):
        quiet_trainer(max_epochs=2).fit(module, _loader())
    assert_trees_close(ported.variables[0], reference.variables[0])
    # several optimizers in the list form still need `{group: tx}` (they update different params)
    with pytest.raises(TypeError, match=r"\{param group: optax transformation\}"):
        _optimizers.from_configure_optimizers("M", ([optax.sgd(0.1), optax.adam(0.1)], []))


def test_a_schedule_for_a_chain_without_an_injected_rate_names_inject_hyperparams():
    tx = _optimizers.from_configure_optimizers(
        "M", {"optimizer": optax.chain(optax.add_decayed_weights(1e-4), optax.sgd(0.1)), "lr_scheduler": _SCHEDULE})
    with pytest.raises(TypeError, match=r"inject_hyperparams\(optax.adam\).*inside an `optax.chain`"):
        tx.init({"w": jnp.zeros(2)})


# ------------------------------------------------- 5: host hooks call the model with its weights

class Doubling(nn.Module):
    """Dense, doubled in train mode: the mode a host call ran in shows in its output."""

    def setup(self):
        self.dense = nn.Dense(1)

    def __call__(self, x, train: bool = False):
        y = self.dense(x)
        return 2 * y if train else y

    def half(self, x):
        return self.dense(x) / 2


class HostCalls(fj.LitModule):
    def __init__(self):
        super().__init__()
        self.model = Doubling()
        self.probe = np.ones((3, 8), np.float32)
        self.seen = []

    def forward(self, x):
        return self.model(x, train=self.training)

    def training_step(self, batch, batch_idx):
        loss = ((self(batch["x"]) - batch["y"]) ** 2).mean()
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", ((self(batch["x"]) - batch["y"]) ** 2).mean())

    def configure_optimizers(self):
        return optax.sgd(0.01)

    def on_train_epoch_end(self):  # Lightning's GAN: `sample_imgs = self(z)`, then the logger's writer
        self.seen.append(("train", self.training, self.current_epoch, self.global_step, np.asarray(self(self.probe)),
                          np.asarray(self.model.half(self.probe)) + np.asarray(self.model.dense(self.probe)),
                          jax.tree.map(np.asarray, self.trainer.state.params)))
        self.logger.experiment.add_histogram("probe", np.asarray(self(self.probe)), self.current_epoch)

    def on_validation_epoch_end(self):
        self.seen.append(("val", self.training, self.current_epoch, self.global_step, np.asarray(self(self.probe))))


class Sampling(fj.Callback):
    def __init__(self):
        self.outputs = []

    def on_train_epoch_end(self, trainer, pl_module):  # a callback calling the module, as in Lightning
        self.outputs.append(np.asarray(pl_module(pl_module.probe)))


def _dense(params, x, scale=1.0):
    p = params["dense"]
    return scale * (x @ np.asarray(p["kernel"]) + np.asarray(p["bias"]))


def test_host_hooks_call_the_model_with_the_current_weights_in_lightnings_mode(tmp_path):
    module, sampling = HostCalls(), Sampling()
    trainer = fj.Trainer(max_epochs=3, num_sanity_val_steps=0, log_every_n_steps=2, enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False, default_root_dir=tmp_path, callbacks=[sampling])
    with count_compiles() as compiles:
        trainer.fit(module, _loader(), _loader(32, seed=1))
    train = [s for s in module.seen if s[0] == "train"]
    val = [s for s in module.seen if s[0] == "val"]
    # Lightning: self.training is True in fit's train hooks, False in validation's (run with lmode.py:
    # a LightningModule recording `self.training` in each hook of fit/test/predict)
    assert [s[1] for s in train] == [True] * 3 and [s[1] for s in val] == [False] * 3
    assert [(s[2], s[3]) for s in train] == [(0, 4), (1, 8), (2, 12)]
    for _, _, _, _, out, half, params in train:  # the weights of that epoch's end, train mode
        np.testing.assert_allclose(out, _dense(params, module.probe, 2.0), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(half, _dense(params, module.probe, 1.5), rtol=1e-5, atol=1e-6)
    assert not np.allclose(train[0][4], train[-1][4])  # the weights moved between epochs
    for (_, _, _, _, out, *_), (_, _, _, _, val_out) in zip(train, val):  # validation runs before the
        np.testing.assert_allclose(val_out, out / 2, rtol=1e-5, atol=1e-6)  # epoch end: same weights, eval mode
    np.testing.assert_allclose(np.stack(sampling.outputs), np.stack([s[4] for s in train]), rtol=1e-6)
    # one compilation per mode and method (train: forward, half, dense; eval: forward), however many calls
    assert compiles["host_call"] == 4
    # after fit, `module(x)` runs on the module's weights (eval mode)
    np.testing.assert_allclose(np.asarray(module(module.probe)), _dense(module.variables[0], module.probe),
                               rtol=1e-5, atol=1e-6)
    # the logger's `experiment` is tensorboardX's SummaryWriter: the histogram is in the event file
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(trainer.log_dir), size_guidance={"histograms": 0})
    events.Reload()
    assert [e.step for e in events.Histograms("probe")] == [0, 1, 2]


class Wide(nn.Module):
    """Wide enough for fsdp to shard its kernel over the 8 devices."""

    @nn.compact
    def __call__(self, x, train: bool = False):
        return nn.Dense(1)(nn.relu(nn.Dense(64)(x)))


class ShardedCalls(fj.LitModule):
    def __init__(self):
        super().__init__()
        self.model = Wide()
        self.seen = []

    def training_step(self, batch, batch_idx):
        return ((self(batch["x"]) - batch["y"]) ** 2).mean()

    def configure_optimizers(self):
        return optax.adam(1e-2)

    def on_train_epoch_end(self):
        x = np.linspace(-1, 1, 16, dtype=np.float32).reshape(2, 8)
        self.seen.append((np.asarray(self(x)), jax.device_get(self.trainer.state.params), x))


@pytest.mark.parametrize("strategy", ["single", "fsdp"])
def test_host_calls_see_sharded_weights_as_the_single_device_run(strategy):
    module = ShardedCalls()
    sharding = fj.strategies.FSDP(min_size_to_shard=0) if strategy == "fsdp" else strategy
    quiet_trainer(max_epochs=2, strategy=sharding).fit(module, _loader())
    for out, params, x in module.seen:
        expected = Wide().apply({"params": params}, x)
        np.testing.assert_allclose(out, np.asarray(expected), rtol=1e-5, atol=1e-6)
    if strategy == "fsdp":  # the kernel is sharded, and the host call read it as it is
        assert not module.trainer.state.params["Dense_1"]["kernel"].sharding.is_fully_replicated


class NNXCalls(fj.LitModule):
    """An NNX model: its object holds the weights of the last sync, the host call the trainer's."""

    def __init__(self):
        super().__init__()
        from flax import nnx

        self.model = nnx.Linear(8, 1, rngs=nnx.Rngs(0))
        self.seen = []

    def training_step(self, batch, batch_idx):
        return ((self.model(batch["x"]) - batch["y"]) ** 2).mean()

    def configure_optimizers(self):
        return optax.sgd(0.05)

    def on_train_epoch_end(self):
        x = np.ones((2, 8), np.float32)
        self.seen.append((np.asarray(self.model(x)), jax.device_get(self.trainer.state.params), x))


def test_host_calls_of_an_nnx_model_use_the_current_weights():
    module = NNXCalls()
    quiet_trainer(max_epochs=2).fit(module, _loader())
    (first, params0, x), (second, params1, _) = module.seen
    for out, params in ((first, params0), (second, params1)):
        np.testing.assert_allclose(out, x @ params["kernel"] + params["bias"], rtol=1e-5, atol=1e-6)
    assert not np.allclose(first, second)  # the weights moved, and the host call saw it mid-fit


def test_reading_the_run_inside_a_traced_hook_or_calling_optimizers_names_the_fitjax_form():
    class EpochInStep(HostCalls):
        def training_step(self, batch, batch_idx):
            return ((self(batch["x"]) - batch["y"]) ** 2).mean() * self.current_epoch

    with pytest.raises(TypeError, match=r"current_epoch was read inside a traced hook.*`batch_idx` is the global step"):
        quiet_trainer(max_epochs=1).fit(EpochInStep(), _loader())

    class TorchManual(HostCalls):
        automatic_optimization = False

        def training_step(self, batch, batch_idx):
            opt = self.optimizers()
            loss = ((self(batch["x"]) - batch["y"]) ** 2).mean()
            self.manual_backward(loss)
            opt.step()

    with pytest.raises(TypeError, match=r"optimizers\(\): .*`\{param group: loss\}`"):
        quiet_trainer(max_epochs=1).fit(TorchManual(), _loader())
    with pytest.raises(TypeError, match=r"manual_backward\(loss\)"):
        HostCalls().manual_backward(1.0)
    module = HostCalls()
    assert (module.logger, module.loggers, module.current_epoch, module.global_step) == (None, [], 0, 0)
    with pytest.raises(RuntimeError, match=r"before the model has weights"):
        module(module.probe)


# ---------------------------------------------- 6: callback_metrics holds the latest step's values

class ThreeWays(HostCalls):
    def training_step(self, batch, batch_idx):
        loss = ((self(batch["x"]) - batch["y"]) ** 2).mean()
        self.log("a", loss)
        self.log("b", loss, on_step=True, on_epoch=True)
        self.log("c", loss, on_step=False, on_epoch=True)
        return loss

    def on_train_epoch_end(self):
        pass


class Seen(fj.Callback):
    def __init__(self):
        self.rows = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        metrics = {k: v for k, v in trainer.callback_metrics.items() if k in "a b b_step b_epoch c".split()}
        self.rows.append(("batch", float(outputs["a"]), metrics))

    def on_train_epoch_end(self, trainer, module):
        metrics = {k: v for k, v in trainer.callback_metrics.items() if k in "a b b_step b_epoch c".split()}
        self.rows.append(("epoch", None, metrics))


def test_callback_metrics_hold_each_steps_values_with_lightnings_keys():
    # Lightning 2.6, the same three `self.log` calls, 4 steps an epoch, log_every_n_steps=3 (lcbm.py):
    #   batch_end 1 {'a': l1, 'b': l1, 'b_step': l1} ... batch_end 4 {'a': l4, 'b': l4, 'b_step': l4}
    #   epoch_end {'a': l4, 'b': mean, 'b_step': l4, 'b_epoch': mean, 'c': mean}
    #   batch_end 5 {'a': l5, 'b': l5, 'b_step': l5, 'b_epoch': mean1, 'c': mean1} ...
    seen = Seen()
    quiet_trainer(max_epochs=2, log_every_n_steps=3, callbacks=[seen]).fit(ThreeWays(), _loader())
    epoch_means = []
    for epoch in range(2):
        rows = seen.rows[epoch * 5:(epoch + 1) * 5]
        losses = [loss for _, loss, _ in rows[:4]]
        for (_, loss, metrics) in rows[:4]:
            before = {"b_epoch": epoch_means[-1], "c": epoch_means[-1]} if epoch_means else {}
            assert metrics == pytest.approx({"a": loss, "b": loss, "b_step": loss, **before}, rel=1e-6)
        epoch_means.append(float(np.mean(losses)))
        assert rows[4][2] == pytest.approx({"a": losses[-1], "b": epoch_means[-1], "b_step": losses[-1],
                                            "b_epoch": epoch_means[-1], "c": epoch_means[-1]}, rel=1e-5)


class Monitored(HostCalls):
    def on_train_epoch_end(self):
        pass


@pytest.mark.filterwarnings("ignore:The number of training batches")
def test_monitoring_a_step_value_works_with_fewer_steps_than_the_log_interval(tmp_path):
    # issue 26: with 4 steps an epoch (< log_every_n_steps=50) `monitor="train_loss"` never saved
    # and EarlyStopping raised: the key only arrived with a log window
    best = fj.ModelCheckpoint(monitor="train_loss", mode="min", save_top_k=1, dirpath=tmp_path)
    stop = fj.EarlyStopping(monitor="train_loss", patience=100, check_on_train_epoch_end=True)
    at_epoch_end = fj.LambdaCallback(on_train_epoch_end=lambda trainer, module: ends.append(
        trainer.callback_metrics["train_loss"]))
    ends = []
    trainer = quiet_trainer(max_epochs=3, log_every_n_steps=50, callbacks=[at_epoch_end, best, stop],
                            enable_checkpointing=True)
    trainer.fit(Monitored(), _loader())
    assert len(ends) == 3 and best.best_model_path
    assert float(best.best_model_score) == pytest.approx(min(ends))


# ----------------------------------------------------------------------------- 7: seed_everything

class Pairs(Regressor):
    """(x, y) batches, as a torch loader yields them."""

    def loss(self, model, batch):
        return super().loss(model, {"x": batch[0], "y": batch[1]})

    def metrics(self, batch, outputs):
        return {}


def test_seed_everything_and_trainer_seed_make_a_shuffling_torch_loader_repeat(monkeypatch):
    torch = pytest.importorskip("torch")
    import random

    from torch.utils.data import DataLoader, TensorDataset

    for name in ("PL_GLOBAL_SEED", "PL_SEED_WORKERS"):
        monkeypatch.setenv(name, "0")  # restored after the test
    data = regression_data(n=64)
    dataset = TensorDataset(torch.as_tensor(data["x"]), torch.as_tensor(data["y"]))

    def fit_once(**trainer_args):
        loader = DataLoader(dataset, batch_size=16, shuffle=True)  # torch's global generator orders it
        module = Pairs()
        quiet_trainer(max_epochs=2, **trainer_args).fit(module, loader)
        return module.variables[0]

    first, second = fit_once(seed=42), fit_once(seed=42)
    assert_trees_close(first, second, rtol=0, atol=0)  # issue 26: differed by up to 6e-4
    with pytest.raises(AssertionError):  # without a seed the order (and so the weights) differ
        assert_trees_close(fit_once(), fit_once(), rtol=0, atol=0)
    assert fj.seed_everything(7, verbose=False) == 7
    draws = (random.random(), np.random.rand(), torch.rand(()).item())
    fj.seed_everything(7, verbose=False)
    assert draws == (random.random(), np.random.rand(), torch.rand(()).item())
    # Lightning's rules: PL_GLOBAL_SEED is set, and read back by seed=None; numpy's range only
    assert fj.seed_everything(None, verbose=False) == 7
    with pytest.raises(ValueError, match=r"seed_everything\(seed=...\) must be an int from 0 to 2\*\*32 - 1"):
        fj.seed_everything(-1)


# ------------------------------------------------- 8: Lightning's flags, TQDMProgressBar, the CLI

def test_lightnings_flags_with_no_jax_meaning_are_accepted_with_a_note(capsys):
    capsys.readouterr()
    trainer = quiet_trainer(max_epochs=1, benchmark=True, inference_mode=False, sync_batchnorm=True,
                            use_distributed_sampler=False)
    notes = [line for line in capsys.readouterr().out.splitlines() if "has no effect under JAX" in line]
    assert [n.split(")")[0] for n in notes] == ["Trainer(benchmark=True", "Trainer(inference_mode=False",
                                                 "Trainer(sync_batchnorm=True", "Trainer(use_distributed_sampler=False"]
    trainer.fit(Regressor(), _loader())  # and the run is the same as without them
    assert trainer.global_step == 4
    quiet_trainer(benchmark=None, inference_mode=True, sync_batchnorm=False)  # Lightning's defaults: silent
    assert "has no effect" not in capsys.readouterr().out
    with pytest.raises(ValueError, match=r"Trainer\(benchmark=...\) must be True or False, got 'yes'"):
        quiet_trainer(benchmark="yes")


def test_tqdm_progress_bar_takes_lightnings_arguments_and_draws(capsys):
    bar = fj.TQDMProgressBar(refresh_rate=2, process_position=0, leave=True)
    trainer = fj.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_model_summary=False,
                         callbacks=[bar])
    assert [cb for cb in trainer.callbacks if isinstance(cb, fj.RichProgressBar)] == [bar]  # not a second bar
    trainer.fit(Regressor(), _loader())
    assert "Epoch 0" in capsys.readouterr().out
    with pytest.raises(ValueError, match=r"enable_progress_bar=False"):
        fj.TQDMProgressBar(refresh_rate=0)
