"""Lightning's GAN domain template
(`examples/pytorch/domain_templates/generative_adversarial_net.py`), ported to
fitjax: an MLP generator and discriminator on images, sampled at every epoch's
end.

Kept as Lightning wrote it: `automatic_optimization = False`, `forward(z)` =
the generator, `training_step(self, batch)` with `self.log_dict`,
`configure_optimizers` with one Adam per network, `on_train_epoch_end` calling
`self(z)` on the current weights and writing the samples with
`logger.experiment.add_image` for each of `self.loggers` at
`self.current_epoch`, and `trainer.fit(model, dm)`. What changed: torch ops
became `jax.numpy`/optax, the two networks are submodules of one flax module
(`self.model.generator`, `self.model.discriminator`; params
`{"generator": ..., "discriminator": ...}`), the noise comes from the
trainer's "noise" rng stream, and the manual `optimizers()` /
`manual_backward` / `step()` calls became the returned
`{"generator": g_loss, "discriminator": d_loss}` (each group updated by its
own loss's gradient, in one jitted step; see docs/porting.md). The data is
sklearn's 8x8 digits instead of MNIST.

    python examples/lightning_gan_images.py --epochs 60
                            # samples of every digit; TensorBoard shows them
"""

from __future__ import annotations

from argparse import ArgumentParser, Namespace

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from sklearn.datasets import load_digits

import fitjax as fj


class DigitsDataModule(fj.DataModule):
    """Stands in for Lightning's `MNISTDataModule`: `(image, label)` batches, images in [-1, 1]."""

    def __init__(self, batch_size: int = 64):
        super().__init__()
        self.batch_size = batch_size

    def setup(self, stage: str) -> None:
        digits = load_digits()
        self.images = (digits.images / 8.0 - 1.0).astype(np.float32)[:, None]  # N, C, H, W
        self.labels = digits.target.astype(np.int32)

    def train_dataloader(self):
        return fj.DataLoader((self.images, self.labels), batch_size=self.batch_size, shuffle=True, drop_last=True)


class Generator(nn.Module):
    latent_dim: int = 100
    img_shape: tuple = (1, 8, 8)

    @nn.compact
    def __call__(self, z, train: bool = False):
        def block(x, out_feat, normalize=True):
            x = nn.Dense(out_feat)(x)
            if normalize:  # torch's BatchNorm1d(out_feat, 0.8): eps=0.8, momentum 0.1
                x = nn.BatchNorm(use_running_average=not train, momentum=0.9, epsilon=0.8)(x)
            return nn.leaky_relu(x, 0.2)

        x = block(z, 128, normalize=False)
        x = block(x, 256)
        x = block(x, 512)
        x = block(x, 1024)
        img = jnp.tanh(nn.Dense(int(np.prod(self.img_shape)))(x))
        return img.reshape(img.shape[0], *self.img_shape)


class Discriminator(nn.Module):
    @nn.compact
    def __call__(self, img):
        x = img.reshape(img.shape[0], -1)
        x = nn.leaky_relu(nn.Dense(512)(x), 0.2)
        x = nn.leaky_relu(nn.Dense(256)(x), 0.2)
        return nn.Dense(1)(x)


class Networks(nn.Module):
    """The torch module's two networks, as submodules of the one flax model fitjax trains."""

    latent_dim: int = 100
    img_shape: tuple = (1, 8, 8)

    def setup(self):
        self.generator = Generator(self.latent_dim, self.img_shape)
        self.discriminator = Discriminator()


def make_grid(images: np.ndarray, nrow: int = 8, padding: int = 2) -> np.ndarray:
    """torchvision's `make_grid` for `(N, C, H, W)` images: one `(C, H', W')` image of tiles."""
    n, c, h, w = images.shape
    rows = -(-n // nrow)
    grid = np.zeros((c, rows * (h + padding) + padding, min(n, nrow) * (w + padding) + padding), images.dtype)
    for i, image in enumerate(images):
        top, left = padding + (i // nrow) * (h + padding), padding + (i % nrow) * (w + padding)
        grid[:, top:top + h, left:left + w] = image
    return grid


class GAN(fj.LitModule):
    rng_streams = ("dropout", "noise")

    def __init__(
        self,
        img_shape: tuple = (1, 8, 8),
        lr: float = 0.0002,
        b1: float = 0.5,
        b2: float = 0.999,
        latent_dim: int = 100,
    ):
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False

        # networks
        self.model = Networks(latent_dim=self.hparams.latent_dim, img_shape=img_shape)

        self.validation_z = np.random.default_rng(0).normal(size=(8, self.hparams.latent_dim)).astype(np.float32)

    def forward(self, z):
        return self.model.generator(z, train=self.training)

    @staticmethod
    def adversarial_loss(y_hat, y):
        return optax.sigmoid_binary_cross_entropy(y_hat, y).mean()

    def training_step(self, batch):
        imgs, _ = batch

        # sample noise
        z = jax.random.normal(self.model.make_rng("noise"), (imgs.shape[0], self.hparams.latent_dim))

        # Train generator
        # ground truth result (ie: all fake)
        valid = jnp.ones((imgs.shape[0], 1))

        # adversarial loss is binary cross-entropy
        g_loss = self.adversarial_loss(self.model.discriminator(self(z)), valid)

        # Train discriminator
        # Measure discriminator's ability to classify real from generated samples
        # how well can it label as real?
        real_loss = self.adversarial_loss(self.model.discriminator(imgs), valid)

        # how well can it label as fake?
        fake = jnp.zeros((imgs.shape[0], 1))

        fake_loss = self.adversarial_loss(self.model.discriminator(jax.lax.stop_gradient(self(z))), fake)

        # discriminator loss is the average of these
        d_loss = (real_loss + fake_loss) / 2

        self.log_dict({"d_loss": d_loss, "g_loss": g_loss})
        return {"generator": g_loss, "discriminator": d_loss}

    def configure_optimizers(self):
        lr = self.hparams.lr
        b1 = self.hparams.b1
        b2 = self.hparams.b2

        opt_g = optax.adam(lr, b1=b1, b2=b2)
        opt_d = optax.adam(lr, b1=b1, b2=b2)
        return {"generator": opt_g, "discriminator": opt_d}

    def on_train_epoch_end(self):
        z = self.validation_z

        # log sampled images
        sample_imgs = np.asarray(self(z))
        grid = make_grid(sample_imgs)
        for logger in self.loggers:
            logger.experiment.add_image("generated_images", grid, self.current_epoch)


def main(args: Namespace) -> GAN:
    # ------------------------
    # 1 INIT LIGHTNING MODEL
    # ------------------------
    model = GAN(lr=args.lr, b1=args.b1, b2=args.b2, latent_dim=args.latent_dim)

    # ------------------------
    # 2 INIT TRAINER
    # ------------------------
    dm = DigitsDataModule()
    trainer = fj.Trainer(accelerator="auto", devices=1, max_epochs=args.epochs, default_root_dir=args.root_dir,
                         enable_progress_bar=not args.no_progress_bar, enable_model_summary=False,
                         enable_checkpointing=False)

    # ------------------------
    # 3 START TRAINING
    # ------------------------
    trainer.fit(model, dm)
    return model


def parse_args(argv: list[str] | None = None) -> Namespace:
    parser = ArgumentParser()

    # Hyperparameters
    parser.add_argument("--lr", type=float, default=0.0002, help="adam: learning rate")
    parser.add_argument("--b1", type=float, default=0.5, help="adam: decay of first order momentum of gradient")
    parser.add_argument("--b2", type=float, default=0.999, help="adam: decay of second order momentum of gradient")
    parser.add_argument("--latent_dim", type=int, default=100, help="dimensionality of the latent space")
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--root-dir", default="runs")
    parser.add_argument("--no-progress-bar", action="store_true")
    return parser.parse_args(argv)


if __name__ == "__main__":
    main(parse_args())
