"""Flax's NNX MNIST example (`examples/mnist/train.py`), ported to fitjax.

The network, the optimizer (SGD, rate 0.1, momentum 0.9), the batch size (128)
and the metrics (loss and accuracy, train and test, per epoch) are the
original's. What changed:

- The original's `train_step`, `eval_step`, its epoch loop, `nnx.MultiMetric`
  bookkeeping and TensorBoard writes (about 70 of its 206 lines) become
  `loss`, `metrics` and one `Trainer.fit`.
- The original makes one `nnx.Rngs(0)` and passes it to each call for
  dropout; here the model takes the step's keys from `self.step_rngs()`:
  folded with the step, so a resumed run draws the same masks (an `nnx.Rngs`
  made inside `loss` would repeat one mask every step).
- `model.train()` / `model.eval()` are the trainer's to call.
- Data: scikit-learn's 8x8 digits stand in for MNIST's 28x28 (no download
  here), so the first dense layer reads 2*2*64 features instead of 7*7*64;
  `drop_last` as the original's `drop_remainder`.

    python examples/flax_mnist.py   # 10 epochs: ~93% test accuracy, ~20 s on
                                    # 2 CPU cores
"""

from __future__ import annotations

import argparse
from functools import partial

import numpy as np
import optax
from flax import nnx
from sklearn.datasets import load_digits

import fitjax as fj


class CNN(nnx.Module):
    """The original's CNN: two conv blocks with batch norm and average pooling, two dense layers."""

    def __init__(self, rngs: nnx.Rngs):
        self.conv1 = nnx.Conv(1, 32, kernel_size=(3, 3), rngs=rngs)
        self.batch_norm1 = nnx.BatchNorm(32, rngs=rngs)
        self.dropout1 = nnx.Dropout(rate=0.025)
        self.conv2 = nnx.Conv(32, 64, kernel_size=(3, 3), rngs=rngs)
        self.batch_norm2 = nnx.BatchNorm(64, rngs=rngs)
        self.avg_pool = partial(nnx.avg_pool, window_shape=(2, 2), strides=(2, 2))
        self.linear1 = nnx.Linear(2 * 2 * 64, 256, rngs=rngs)  # 7 * 7 * 64 on 28x28 MNIST
        self.dropout2 = nnx.Dropout(rate=0.025)
        self.linear2 = nnx.Linear(256, 10, rngs=rngs)

    def __call__(self, x, rngs: nnx.Rngs | None = None):
        x = self.avg_pool(nnx.relu(self.batch_norm1(self.dropout1(self.conv1(x), rngs=rngs))))
        x = self.avg_pool(nnx.relu(self.batch_norm2(self.conv2(x))))
        x = x.reshape(x.shape[0], -1)
        x = nnx.relu(self.dropout2(self.linear1(x), rngs=rngs))
        return self.linear2(x)


class MNISTClassifier(fj.LitModule):
    """The original's `loss_fn`, metrics and optimizer, as a LitModule."""

    def __init__(self, learning_rate: float = 0.1, momentum: float = 0.9):
        super().__init__()
        self.save_hyperparameters()
        self.model = CNN(rngs=nnx.Rngs(0))

    def loss(self, model, batch):
        rngs = self.step_rngs() if self.training else None  # the original passes None to eval_step
        logits = model(batch["image"], rngs)
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()
        return loss, {"logits": logits}

    def metrics(self, batch, outputs):
        return {"accuracy": (outputs["logits"].argmax(-1) == batch["label"]).mean()}

    def configure_optimizer(self):
        return optax.sgd(self.hparams.learning_rate, self.hparams.momentum)


def splits(seed: int = 0) -> tuple[dict, dict]:
    """(train, test): 80/20 of the digits, images scaled to [0, 1] as the original scales by 255."""
    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[..., None]
    labels = digits.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(labels))
    cut = int(0.8 * len(labels))
    return ({"image": images[order[:cut]], "label": labels[order[:cut]]},
            {"image": images[order[cut:]], "label": labels[order[cut:]]})


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--root-dir", default=".", help="where fitjax_logs/ and checkpoints go")
    parser.add_argument("--no-progress-bar", action="store_true")
    args = parser.parse_args(argv)

    train, test = splits()
    trainer = fj.Trainer(max_epochs=args.num_epochs, default_root_dir=args.root_dir,
                         enable_progress_bar=not args.no_progress_bar, seed=0)
    trainer.fit(MNISTClassifier(),
                fj.DataLoader(train, batch_size=args.batch_size, shuffle=True, drop_last=True, seed=0),
                fj.DataLoader(test, batch_size=args.batch_size))
    results = {name: float(value) for name, value in trainer.callback_metrics.items()}
    print(f"test_loss {results['val/loss']:.4f}, test_accuracy {100 * results['val/accuracy']:.2f}")
    return results


if __name__ == "__main__":
    main()
