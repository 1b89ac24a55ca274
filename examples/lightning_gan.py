"""A tiny GAN with Lightning's manual optimization, ported to fitjax: two
parameter groups, two optimizers, one jitted step.

Lightning's manual GAN calls `opt_d.step()` then `opt_g.step()` imperatively.
The pure-JAX form: `self.automatic_optimization = False`,
`configure_optimizers` returns one optax transformation per parameter group
(`{"generator": ..., "discriminator": ...}`, the top-level keys of the model's
params), and `training_step` returns `{group: loss}`. fitjax differentiates
each group's loss with respect to that group only (one forward pass, one
backward pass per group) and updates both groups together in the same step.

    python examples/lightning_gan.py  # learns a shifted, stretched 2-D Gaussian
"""

from __future__ import annotations

import argparse

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

import fitjax as fj

TARGET_MEAN = np.array([2.0, -1.0], np.float32)
TARGET_STD = np.array([0.5, 1.5], np.float32)
LATENT = 4


def target_samples(n: int, seed: int = 0) -> np.ndarray:
    return (TARGET_MEAN + TARGET_STD * np.random.default_rng(seed).normal(size=(n, 2))).astype(np.float32)


class GAN(nn.Module):
    """Generator and discriminator as submodules: params `{"generator": ..., "discriminator": ...}`."""

    def setup(self):
        self.generator = nn.Sequential([nn.Dense(16), nn.tanh, nn.Dense(2)])
        self.discriminator = nn.Sequential([nn.Dense(64), nn.tanh, nn.Dense(64), nn.tanh, nn.Dense(1)])

    def generate(self, n: int):
        # Noise from the trainer's "noise" rng stream: a fresh key every step, reproducible runs.
        return self.generator(jax.random.normal(self.make_rng("noise"), (n, LATENT)))

    def discriminate(self, x):
        return self.discriminator(x)[:, 0]

    def __call__(self, n: int):  # initialises both halves
        return self.discriminate(self.generate(n))


class LitGAN(fj.LitModule):
    rng_streams = ("noise",)

    def __init__(self, lr: float = 2e-3):
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.model = GAN()

    def training_step(self, batch, batch_idx):
        (real,) = batch
        fake = self.model.generate(real.shape[0])
        real_logits, fake_logits = self.model.discriminate(real), self.model.discriminate(fake)
        bce = optax.sigmoid_binary_cross_entropy
        d_loss = (bce(real_logits, jnp.ones_like(real_logits))
                  + bce(fake_logits, jnp.zeros_like(fake_logits))).mean()
        g_loss = bce(fake_logits, jnp.ones_like(fake_logits)).mean()  # non-saturating
        self.log_dict({"d_loss": d_loss, "g_loss": g_loss}, prog_bar=True)
        return {"discriminator": d_loss, "generator": g_loss}

    def predict_step(self, batch, batch_idx):
        (real,) = batch
        return self.model.generate(real.shape[0])

    def configure_optimizers(self):
        adam = optax.adam(self.hparams.lr, b1=0.5)
        return {"generator": adam, "discriminator": adam}


def main(argv: list[str] | None = None) -> dict[str, np.ndarray]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--root-dir", default="runs")
    parser.add_argument("--no-progress-bar", action="store_true")
    args = parser.parse_args(argv)

    trainer = fj.Trainer(max_epochs=args.epochs, default_root_dir=args.root_dir,
                         enable_progress_bar=not args.no_progress_bar, enable_model_summary=False)
    module = LitGAN()
    trainer.fit(module, fj.DataLoader((target_samples(4096),), batch_size=128, shuffle=True, drop_last=True))
    samples = trainer.predict(module, fj.DataLoader((target_samples(2048, seed=1),), batch_size=2048))
    results = {"mean": samples.mean(0), "std": samples.std(0)}
    print(f"generated mean {results['mean']} (target {TARGET_MEAN}), std {results['std']} (target {TARGET_STD})")
    return results


if __name__ == "__main__":
    main()
