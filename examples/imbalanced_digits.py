"""Imbalanced classes: digits 5-9 kept at 1 in 8 in the train split, scored by
macro F1 and AUROC.

    python examples/imbalanced_digits.py    # ~20 s on a laptop CPU

Accuracy hides the rare classes; the macro F1 (each class counts the same) and
the one-vs-rest AUROC do not. Both are fitjax.metrics classes with
torchmetrics' arguments: their states (per-class counts, per-class threshold
counts) are merged on the device over the whole validation set, and the
numbers are computed once per validation. The checkpoint kept is the epoch
with the best macro F1; the confusion matrix is drawn in TensorBoard's Images
tab (`tensorboard --logdir runs`).
"""

from __future__ import annotations

import argparse

import flax.linen as nn
import jax
import numpy as np
import optax

import fitjax as fj
from digits import digits_splits
from fitjax.metrics import AUROC, ConfusionMatrix, F1Score

RARE = (5, 6, 7, 8, 9)


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Dense(64)(x.reshape(x.shape[0], -1)))
        return nn.Dense(10)(x)


class ImbalancedDigits(fj.LitModule):
    """An MLP on 8x8 digits, with macro F1, AUROC and a confusion matrix on validation."""

    def __init__(self, lr: float = 3e-3):
        super().__init__()
        self.save_hyperparameters()
        self.model = MLP()

    def loss(self, model, batch):
        logits = model(batch["image"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean(), logits

    def metrics(self, batch, logits):
        if self.training:  # the train step stays as it was: the numbers below are for validation
            return {}
        probs, labels = jax.nn.softmax(logits), batch["label"]
        return {"f1": F1Score(task="multiclass", num_classes=10, average="macro").update(probs, labels),
                "auroc": AUROC(task="multiclass", num_classes=10).update(probs, labels),
                "acc": (logits.argmax(-1) == labels).mean(),
                "confusion": ConfusionMatrix(task="multiclass", num_classes=10).update(probs, labels)}

    def configure_optimizer(self):
        return optax.adam(self.hparams.lr)


def imbalanced_splits(keep: float = 1 / 8, seed: int = 0) -> tuple[dict, dict]:
    """The digits' train split with the `RARE` classes subsampled to `keep`; validation untouched."""
    train, val = digits_splits(seed)
    rng = np.random.default_rng(seed)
    rare = np.isin(train["label"], RARE)
    kept = ~rare | (rng.random(len(rare)) < keep)
    return {k: v[kept] for k, v in train.items()}, val


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--strategy", default="auto")
    parser.add_argument("--root-dir", default="runs")
    parser.add_argument("--no-progress-bar", action="store_true")
    args = parser.parse_args(argv)

    train, val = imbalanced_splits()
    best_f1 = fj.ModelCheckpoint(monitor="val/f1", mode="max", save_top_k=1, filename="{epoch}-{val/f1:.3f}")
    trainer = fj.Trainer(max_epochs=args.epochs, strategy=args.strategy, default_root_dir=args.root_dir,
                         callbacks=[best_f1], enable_progress_bar=not args.no_progress_bar)
    trainer.fit(ImbalancedDigits(), fj.DataLoader(train, batch_size=32, shuffle=True, drop_last=True),
                fj.DataLoader(val, batch_size=128))
    found = trainer.callback_metrics
    print(f"last epoch: accuracy {found['val/acc']:.3f}  macro F1 {found['val/f1']:.3f}  "
          f"AUROC {found['val/auroc']:.3f}; best macro F1 {best_f1.best_model_score:.3f} "
          f"kept at {best_f1.best_model_path}")
    return {"metrics": dict(found), "best_model_path": best_f1.best_model_path,
            "best_f1": float(best_f1.best_model_score), "log_dir": trainer.log_dir}


if __name__ == "__main__":
    main()
