"""Metric values reach every logger and callback: a confusion matrix as a picture in TensorBoard
(read back with TensorBoard's reader), per-class numbers as `name/i` scalars, EarlyStopping on a
metric; and the errors a user meets when a metric is logged where it cannot be."""

from __future__ import annotations

import io

import flax.linen as nn
import jax
import numpy as np
import optax
import pytest

import fitjax as fj
from fitjax import metrics as fm

_rng = np.random.default_rng(1)
X = _rng.normal(size=(96, 5)).astype(np.float32)
Y = _rng.integers(0, 3, 96)
DATA = [{"x": X[i:i + 32], "y": Y[i:i + 32]} for i in range(0, 96, 32)]


class Classifier(fj.LitModule):
    def __init__(self):
        super().__init__()
        self.model = nn.Dense(3)

    def loss(self, model, batch):
        logits = model(batch["x"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean(), logits

    def metrics(self, batch, logits):
        return {"cm": fm.ConfusionMatrix(task="multiclass", num_classes=3).update(logits, batch["y"]),
                "f1": fm.F1Score(task="multiclass", num_classes=3, average="none").update(logits, batch["y"])}

    def configure_optimizer(self):
        return optax.sgd(0.0)


def test_confusion_matrix_is_a_picture_and_per_class_scores_are_scalars_in_tensorboard(tmp_path):
    from PIL import Image
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = fj.TensorBoardLogger(tmp_path, name="tb")
    stop = fj.EarlyStopping(monitor="val/f1/0", mode="max", patience=0)  # never improves at lr 0
    module = Classifier()
    trainer = fj.Trainer(max_epochs=5, logger=logger, callbacks=[stop], enable_progress_bar=False,
                         enable_checkpointing=False, enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(module, DATA, DATA)
    assert trainer.current_epoch == 2  # epoch 0 sets the best, epoch 1 does not beat it: stop

    events = EventAccumulator(str(logger.log_dir), size_guidance={"images": 0, "scalars": 0})
    events.Reload()
    assert {"val/cm", "train/cm_epoch"} <= set(events.Tags()["images"])
    assert {"val/f1/0", "val/f1/1", "val/f1/2"} <= set(events.Tags()["scalars"])
    image = events.Images("val/cm")[-1]
    picture = np.asarray(Image.open(io.BytesIO(image.encoded_image_string)).convert("RGB"))
    assert picture.shape == (48, 48, 3)  # 3 x 3 cells of 16 pixels
    logits = np.asarray(module.model.apply({"params": module.variables[0]}, X))
    counts = np.zeros((3, 3))
    np.add.at(counts, (Y, logits.argmax(-1)), 1)
    # the darkest cell of each row is the class most often predicted for that true class
    darkest = picture[8::16, 8::16].sum(-1).argmin(-1)
    np.testing.assert_array_equal(darkest, counts.argmax(-1))


def test_logging_a_metric_where_it_cannot_be_logged_says_where():
    class HostLog(Classifier):
        def __init__(self):
            super().__init__()
            self.f1 = fm.F1Score(task="binary")

        def metrics(self, batch, logits):
            return {"f1": self.f1}  # never updated

    trainer = fj.Trainer(max_epochs=1, logger=False, enable_progress_bar=False, enable_checkpointing=False,
                         enable_model_summary=False)
    with pytest.raises(ValueError, match=r"F1Score\(.*\) holds no state: it is a declaration, and it was not updated"):
        trainer.fit(HostLog(), DATA)
