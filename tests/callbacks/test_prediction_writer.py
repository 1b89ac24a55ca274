"""`BasePredictionWriter`, as Lightning 2.6 calls it.

Lightning 2.6.6 (CPU, scratch venv), `BasePredictionWriter(write_interval)` subclass recording its
calls, `trainer.predict(model, DataLoader(TensorDataset(x), batch_size=4), return_predictions=...)`
over 10 rows: "batch" calls `write_on_batch_end(trainer, module, prediction, batch_indices,
batch, batch_idx, dataloader_idx)` with batch_indices [0, 1, 2, 3], [4, 5, 6, 7], [8, 9] and
dataloader_idx 0; "epoch" calls `write_on_epoch_end(trainer, module, predictions, batch_indices)`
once with 3 predictions (one per batch, also with return_predictions=False) and batch_indices
[[[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]] (a list per loader); "batch_and_epoch" both; a bad
interval raises ("`write_interval` should be one of ['batch', 'epoch', 'batch_and_epoch']"). fitjax's indices are the rows' positions in the data (Lightning's sampler indices: the
same for a loader that does not shuffle).
"""

from __future__ import annotations

import tracemalloc

import flax.linen as nn
import numpy as np
import pytest

import fitjax as fj
from helpers import quiet_trainer

pytestmark = pytest.mark.filterwarnings("ignore:.*was never fitted:UserWarning")


class Identity(fj.LitModule):
    def __init__(self):
        super().__init__()
        self.model = nn.Dense(1)

    def loss(self, model, batch):
        return model(batch["x"]).mean()

    def predict_step(self, model, batch):
        return batch["x"] * 2.0 + 0.0 * model(batch["x"])

    def configure_optimizer(self):
        import optax
        return optax.sgd(0.1)


class Recorder(fj.BasePredictionWriter):
    def __init__(self, interval):
        super().__init__(write_interval=interval)
        self.batches, self.epochs = [], []

    def write_on_batch_end(self, trainer, module, prediction, batch_indices, batch, batch_idx, dataloader_idx):
        self.batches.append((np.asarray(prediction), list(batch_indices), batch_idx, dataloader_idx))

    def write_on_epoch_end(self, trainer, module, predictions, batch_indices):
        self.epochs.append(([np.asarray(p) for p in predictions], batch_indices))


LIGHTNING_INDICES = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


@pytest.mark.parametrize("strategy, devices", [("single", 1), ("dp", 2), ("fsdp", 2)])
@pytest.mark.parametrize("interval", ["batch", "epoch", "batch_and_epoch"])
def test_the_writer_gets_lightnings_calls(interval, strategy, devices):
    x = np.arange(40, dtype=np.float32).reshape(10, 4)
    writer = Recorder(interval)
    trainer = quiet_trainer(strategy=strategy, devices=devices, callbacks=[writer])
    assert trainer.predict(Identity(), fj.DataLoader({"x": x}, batch_size=4), return_predictions=False) is None
    if interval != "epoch":
        assert [(idx, b, d) for _, idx, b, d in writer.batches] == [(i, b, 0) for b, i in enumerate(LIGHTNING_INDICES)]
        np.testing.assert_allclose(np.concatenate([p for p, *_ in writer.batches]), x * 2)
    else:
        assert writer.batches == []
    if interval != "batch":
        ((predictions, indices),) = writer.epochs
        assert indices == [LIGHTNING_INDICES] and len(predictions) == 3
        np.testing.assert_allclose(np.concatenate(predictions), x * 2)
    else:
        assert writer.epochs == []


def test_a_bad_interval_names_the_choices():
    with pytest.raises(ValueError, match=r"write_interval=.*\['batch', 'epoch', 'batch_and_epoch'\].*'step'"):
        Recorder("step")


class Discard(fj.BasePredictionWriter):
    def write_on_batch_end(self, trainer, module, prediction, batch_indices, batch, batch_idx, dataloader_idx):
        self.rows = getattr(self, "rows", 0) + len(prediction)


def _peak_growth(return_predictions):
    """Peak traced memory while predicting 200 batches of 64 x 256 float32 (64 KiB each)."""
    x = np.ones((200 * 64, 256), np.float32)
    writer = Discard()
    trainer = quiet_trainer(strategy="single", callbacks=[writer])
    loader = fj.DataLoader({"x": x}, batch_size=64)
    trainer.predict(Identity(), fj.DataLoader({"x": x[:64]}, batch_size=64))  # compiled before measuring
    writer.rows = 0
    tracemalloc.start()
    try:
        out = trainer.predict(Identity(), loader, return_predictions=return_predictions)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert writer.rows == len(x)
    return peak, out


def test_return_predictions_false_holds_nothing():
    streamed, out = _peak_growth(False)
    assert out is None
    held, out = _peak_growth(True)
    assert out.shape == (200 * 64, 256)
    # 200 batches of 64 KiB: held they pass 12 MiB; streamed a few batches at most
    assert held > 12 * 2 ** 20 and streamed < 3 * 2 ** 20, (held, streamed)
