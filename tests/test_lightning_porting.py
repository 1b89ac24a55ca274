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
from fitjax import _optimizers
from helpers import Regressor, assert_trees_close, quiet_trainer, regression_data


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
