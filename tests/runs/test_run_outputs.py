"""What the steps of a `Trainer(runs=...)` fit hand back: `predict`'s rows and the batch-end
hooks' `outputs` hold every run's rows side by side, `[rows, runs, ...]`."""

from __future__ import annotations

import jax
import numpy as np

import fitjax as fj
from helpers import quiet_trainer
from test_many_runs import DATA, Decayed, loader, member


class Predicting(Decayed):
    def predict_step(self, model, batch):
        return model(batch["x"], train=False)


class Outputs(fj.Callback):
    def __init__(self):
        self.train, self.val = [], []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.train.append(jax.device_get(outputs))

    def on_validation_batch_end(self, trainer, module, outputs, batch, batch_idx, dataloader_idx=0):
        self.val.append(jax.device_get(outputs))


def test_predict_and_the_hooks_outputs_hold_each_runs_rows():
    seen = Outputs()
    trainer = quiet_trainer(max_epochs=1, runs=2, accumulate_grad_batches=2, callbacks=[seen])
    module = Predicting()
    trainer.fit(module, loader(), fj.DataLoader(DATA, batch_size=24))  # 64 rows: the last batch 16 of 24

    predictions = trainer.predict(module, fj.DataLoader({"x": DATA["x"]}, batch_size=24))
    assert predictions.shape == (64, 2, 1)  # every example once, each run's prediction on axis 1
    state = jax.device_get(trainer.state)
    for i in range(2):  # run i's column: its own weights' predictions
        variables = {"params": member(state.params, i), **member(state.model_state, i)}
        alone = module.model.apply(variables, DATA["x"], train=False)
        np.testing.assert_allclose(predictions[:, i], alone, rtol=1e-5, atol=1e-6)

    train = seen.train[0]  # [micro-batches, rows, runs, ...], each run's logged values by name
    assert train["pred"].shape == (2, 16, 2, 1) and {"loss/run_0", "loss/run_1"} <= set(train)
    last = seen.val[-1]  # the last validation batch: its 16 real rows, not the padding
    assert last["pred"].shape == (16, 2, 1)
    np.testing.assert_allclose(last["pred"], predictions[48:], rtol=1e-5, atol=1e-6)
