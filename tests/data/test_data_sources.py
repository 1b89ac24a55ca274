"""fit accepts the data users have: fj.DataLoader, torch DataLoader, grain, iterables, DataModule."""

from __future__ import annotations

import grain
import numpy as np
import torch
from helpers import Regressor, assert_trees_close, quiet_trainer, regression_data

import fitjax as fj

DATA = regression_data(n=128)


def _fit(train, **kwargs):
    module = Regressor(batchnorm=False)
    trainer = quiet_trainer(max_epochs=2, strategy="single", **kwargs)
    trainer.fit(module, train)
    return trainer, module


def test_every_source_gives_the_same_training_as_fj_dataloader():
    _, reference = _fit(fj.DataLoader(DATA, batch_size=32))

    batches = [{k: v[i:i + 32] for k, v in DATA.items()} for i in range(0, 128, 32)]
    _, from_list = _fit(batches)

    tensors = torch.utils.data.TensorDataset(torch.from_numpy(DATA["x"]), torch.from_numpy(DATA["y"]))
    torch_loader = torch.utils.data.DataLoader(tensors, batch_size=32, shuffle=False)

    class TupleRegressor(Regressor):
        def loss(self, model, batch):
            x, y = batch
            return super().loss(model, {"x": x, "y": y})

        def metrics(self, batch, outputs):
            x, y = batch
            return super().metrics({"x": x, "y": y}, outputs)

    from_torch = TupleRegressor(batchnorm=False)
    quiet_trainer(max_epochs=2, strategy="single").fit(from_torch, torch_loader)

    records = [{"x": DATA["x"][i], "y": DATA["y"][i]} for i in range(128)]
    grain_ds = grain.MapDataset.source(records).batch(32)
    _, from_grain = _fit(grain_ds)

    for other in (from_list, from_torch, from_grain):
        assert_trees_close(other.variables, reference.variables, rtol=1e-6, atol=1e-7)


def test_datamodule_hooks_run_and_feed_fit_validate_test_predict():
    calls = []

    class Regression(fj.DataModule):
        def prepare_data(self):
            calls.append("prepare_data")

        def setup(self, stage):
            calls.append(f"setup:{stage}")
            self.train, self.val = regression_data(n=128), regression_data(n=40, seed=5)

        def train_dataloader(self):
            return fj.DataLoader(self.train, batch_size=32, shuffle=True)

        def val_dataloader(self):
            return fj.DataLoader(self.val, batch_size=16)

        def test_dataloader(self):
            return fj.DataLoader(self.val, batch_size=16)

        def predict_dataloader(self):
            return fj.DataLoader({"x": self.val["x"]}, batch_size=16)

    dm = Regression()
    module = Regressor()
    trainer = quiet_trainer(max_epochs=2, strategy="single")
    trainer.fit(module, datamodule=dm)
    assert "val/loss" in trainer.callback_metrics
    (res,) = trainer.test(module, datamodule=dm)
    preds = trainer.predict(module, datamodule=dm)
    assert preds.shape == (40, 1) and "test/loss" in res
    assert calls[:2] == ["prepare_data", "setup:fit"] and "setup:test" in calls and "setup:predict" in calls


def test_one_shot_generator_with_max_steps():
    def stream():
        rng = np.random.default_rng(0)
        while True:
            idx = rng.integers(0, 128, size=32)
            yield {k: v[idx] for k, v in DATA.items()}

    trainer, _ = _fit(stream(), max_steps=7)
    assert trainer.global_step == 7
