"""Trainer(reload_dataloaders_every_n_epochs=n): the datamodule's (or module's) loaders asked for
again every n epochs, as Lightning 2.6 asks; loaders passed directly are kept; dp and fsdp."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import Regressor, assert_trees_close, quiet_trainer

import fitjax as fj
from fitjax.strategies import FSDP


pytestmark = pytest.mark.usefixtures("compile_cache")  # tests/conftest.py


# Lightning 2.6 (/work/lvenv, torch CPU): a LightningDataModule whose train_dataloader() returns 8
# rows all equal to the number of times it was called (batch 4) and whose val_dataloader() returns
# zeros, max_epochs=5, reload_dataloaders_every_n_epochs=n: the epochs in which each hook was called,
# and the first x of each epoch's first batch.
LIGHTNING = {
    2: {"train": [0, 2, 4], "val": [0, 2, 4], "first_x": [1.0, 1.0, 2.0, 2.0, 3.0]},
    1: {"train": [0, 1, 2, 3, 4], "val": [0, 1, 2, 3, 4], "first_x": [1.0, 2.0, 3.0, 4.0, 5.0]},
    0: {"train": [0], "val": [0], "first_x": [1.0] * 5},
}


class Counting(fj.DataModule):
    """Loaders whose train rows say how many times `train_dataloader()` was called."""

    def __init__(self, batch_size=4):
        super().__init__()
        self.batch_size, self.epoch, self.calls = batch_size, lambda: 0, {"train": [], "val": []}

    def train_dataloader(self):
        self.calls["train"].append(self.epoch())
        x = np.full((2 * self.batch_size, 1), float(len(self.calls["train"])), np.float32)
        return fj.DataLoader({"x": x, "y": x * 0.1}, batch_size=self.batch_size)

    def val_dataloader(self):
        self.calls["val"].append(self.epoch())
        zeros = np.zeros((2 * self.batch_size, 1), np.float32)
        return fj.DataLoader({"x": zeros, "y": zeros}, batch_size=self.batch_size)


class FirstX(fj.Callback):
    def __init__(self):
        self.seen = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if batch_idx == 0:
            self.seen.append(float(np.asarray(batch["x"])[0, 0]))


def _fit(n, strategy="single", batch_size=4):
    first_x = FirstX()
    trainer = quiet_trainer(max_epochs=5, reload_dataloaders_every_n_epochs=n, strategy=strategy, callbacks=[first_x])
    dm = Counting(batch_size)
    dm.epoch = lambda: trainer.current_epoch
    trainer.fit(Regressor(batchnorm=False), datamodule=dm)
    return trainer, dm, first_x.seen


@pytest.mark.parametrize("n", [2, 1, 0])
def test_reloads_when_lightning_does(n):
    _, dm, first_x = _fit(n)
    assert dm.calls == {"train": LIGHTNING[n]["train"], "val": LIGHTNING[n]["val"]}
    assert first_x == LIGHTNING[n]["first_x"]


def test_under_dp_and_fsdp_as_one_device():
    single, _, _ = _fit(2, batch_size=8)
    for strategy in ("dp", FSDP(min_size_to_shard=8)):
        sharded, dm, first_x = _fit(2, strategy=strategy, batch_size=8)
        assert dm.calls["train"] == [0, 2, 4] and first_x == [1.0, 1.0, 2.0, 2.0, 3.0]
        assert_trees_close(sharded.state.params, single.state.params, rtol=1e-4, atol=1e-5)  # float32 sums in another order


def test_the_modules_own_hooks_are_asked_again_and_loaders_passed_directly_are_kept():
    calls = []

    class OwnLoaders(Regressor):
        def train_dataloader(self):
            calls.append(len(calls))
            x = np.full((8, 1), float(len(calls)), np.float32)
            return fj.DataLoader({"x": x, "y": x}, batch_size=4)

    first_x = FirstX()
    quiet_trainer(max_epochs=3, reload_dataloaders_every_n_epochs=1, strategy="single",
                  callbacks=[first_x]).fit(OwnLoaders(batchnorm=False))
    assert first_x.seen == [1.0, 2.0, 3.0]
    first_x = FirstX()
    loader = Counting().train_dataloader()
    quiet_trainer(max_epochs=3, reload_dataloaders_every_n_epochs=1, strategy="single",
                  callbacks=[first_x]).fit(Regressor(batchnorm=False), loader)
    assert first_x.seen == [1.0, 1.0, 1.0]


def test_a_negative_count_is_named():
    with pytest.raises(ValueError, match=r"reload_dataloaders_every_n_epochs=.*int >= 0.*-1"):
        fj.Trainer(reload_dataloaders_every_n_epochs=-1)
