"""The run both sides of the multi-process test do: the same data, strategies and stages."""

from __future__ import annotations

import flax.linen as nn
import jax
import numpy as np
import optax
from helpers import regression_data

import fitjax as fj
from fitjax import metrics as fm
from fitjax.strategies import FSDP

STRATEGIES = {"dp": fj.strategies.DataParallel, "fsdp": lambda: FSDP(data=2, fsdp=4, min_size_to_shard=0)}


def fit_and_predict(trainer: fj.Trainer, module: fj.LitModule):
    """2 epochs of 4 steps; validation and predict end on partial batches (100 = 3×32 + 4, 77 = 4×16
    + 13), so one process's slice of the last batch is smaller than the other's, or empty."""
    trainer.fit(module, fj.DataLoader(regression_data(n=128), batch_size=32, shuffle=True, seed=1),
                fj.DataLoader(regression_data(n=100, seed=1), batch_size=32))
    predictions = trainer.predict(module, fj.DataLoader({"x": regression_data(n=77, seed=2)["x"]}, batch_size=16))
    val = dict(trainer.callback_metrics)
    # two loaders (45 = 32 + 13, split 8 + 5): each example of each counted once
    several = trainer.validate(module, [fj.DataLoader(regression_data(n=100, seed=1), batch_size=32),
                                        fj.DataLoader(regression_data(n=45, seed=3), batch_size=32)], verbose=False)
    return predictions, val, several


class MetricsClassifier(fj.LitModule):
    """Lightning-style, with stateful metrics (F1 macro, AUROC) and the predictions' first input
    column appended per batch (`self.validation_step_outputs`), recorded at each epoch's end."""

    def __init__(self):
        super().__init__()
        self.model = nn.Dense(4)
        self.val_f1 = fm.F1Score(task="multiclass", num_classes=4, average="macro")
        self.val_auroc = fm.AUROC(task="multiclass", num_classes=4)
        self.validation_step_outputs, self.seen_rows = [], []

    def training_step(self, batch, batch_idx):
        logits = self.model(batch["x"])
        self.log("train_f1", fm.F1Score(task="multiclass", num_classes=4, average="macro").update(
            logits, batch["y"]), on_step=False, on_epoch=True)
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()

    def validation_step(self, batch, batch_idx):
        probs = jax.nn.softmax(self.model(batch["x"]))
        self.val_f1(probs, batch["y"])
        self.val_auroc(probs, batch["y"])
        self.log("val_f1", self.val_f1)
        self.log("val_auroc", self.val_auroc)
        self.validation_step_outputs.append(batch["x"][:, 0])

    def on_validation_epoch_end(self):
        self.seen_rows.append(np.concatenate(self.validation_step_outputs))
        self.validation_step_outputs.clear()

    def configure_optimizers(self):
        return optax.adam(0.05)


def classification_data(n: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 6)).astype(np.float32)
    y = np.where(rng.random(n) < 0.6, 0, rng.integers(1, 4, n))  # imbalanced: mostly class 0
    x[:, 1] += y  # learnable
    return {"x": x, "y": y}


def fit_metrics(trainer: fj.Trainer) -> dict:
    """2 epochs of 4 steps; validation ends on a partial batch (100 = 3×32 + 4); the logged
    metrics and each process's appended rows."""
    module = MetricsClassifier()
    trainer.fit(module, fj.DataLoader(classification_data(128, 4), batch_size=32, shuffle=True, seed=1),
                fj.DataLoader(classification_data(100, 5), batch_size=32))
    return {"logged": {k: float(v) for k, v in trainer.callback_metrics.items() if "f1" in k or "auroc" in k},
            "rows": module.seen_rows}
