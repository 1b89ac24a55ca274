"""Lightning's autoencoder example (encoder + decoder, MSE reconstruction),
ported to fitjax.

Lightning keeps `self.encoder` and `self.decoder` side by side; fitjax trains
one flax model, so the two become submodules of `AutoEncoder` and `forward`
calls its `encode` method. Everything else reads as in Lightning:
`training_step`, `validation_step`, `self.log`, `configure_optimizers`.

    python examples/lightning_autoencoder.py
                            # reconstruction MSE on held-out digits < 0.02
"""

from __future__ import annotations

import argparse

import flax.linen as nn
import numpy as np
import optax
from sklearn.datasets import load_digits

import fitjax as fj


class AutoEncoder(nn.Module):
    latent: int = 16

    def setup(self):
        self.encoder = nn.Sequential([nn.Dense(64), nn.relu, nn.Dense(self.latent)])
        self.decoder = nn.Sequential([nn.Dense(64), nn.relu, nn.Dense(64), nn.sigmoid])

    def encode(self, x):
        return self.encoder(x)

    def __call__(self, x):
        return self.decoder(self.encoder(x))


class LitAutoEncoder(fj.LitModule):
    def __init__(self, lr: float = 3e-3, latent: int = 16):
        super().__init__()
        self.save_hyperparameters()
        self.model = AutoEncoder(latent)

    def forward(self, x):  # as in Lightning: forward is what inference calls, here the embedding
        return self.model.encode(x)

    def training_step(self, batch, batch_idx):
        (x,) = batch
        loss = ((self.model(x) - x) ** 2).mean()
        self.log("train_mse", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        (x,) = batch
        self.log("val_mse", ((self.model(x) - x) ** 2).mean())

    def configure_optimizers(self):
        return optax.adam(self.hparams.lr)


def digits_pixels(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    x = (load_digits().data / 16.0).astype(np.float32)
    order = np.random.default_rng(seed).permutation(len(x))
    cut = int(0.8 * len(x))
    return x[order[:cut]], x[order[cut:]]


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--root-dir", default="runs")
    parser.add_argument("--no-progress-bar", action="store_true")
    args = parser.parse_args(argv)

    train, val = digits_pixels()
    trainer = fj.Trainer(max_epochs=args.epochs, default_root_dir=args.root_dir,
                         enable_progress_bar=not args.no_progress_bar, enable_model_summary=False)
    module = LitAutoEncoder()
    trainer.fit(module, fj.DataLoader((train,), batch_size=64, shuffle=True, drop_last=True),
                fj.DataLoader((val,), batch_size=256))
    embeddings = trainer.predict(module, fj.DataLoader((val,), batch_size=256))  # forward: encode
    results = {"val_mse": trainer.callback_metrics["val_mse"], "embedding_dim": embeddings.shape[1]}
    print(f"reconstruction MSE on held-out digits {results['val_mse']:.4f}")
    return results


if __name__ == "__main__":
    main()
