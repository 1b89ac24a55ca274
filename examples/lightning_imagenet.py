"""Lightning's ImageNet example
(`examples/pytorch/domain_templates/imagenet.py`), ported to fitjax.

Kept as Lightning wrote it: the module owns its data (`setup(stage)`,
`train_dataloader()`, `val_dataloader()`, `test_dataloader()` returning torch
`DataLoader`s), `training_step` / `eval_step` with `self.log`,
`configure_optimizers` returning `[optimizer], [scheduler]` for an SGD with
momentum and weight decay and a step-decay `LambdaLR`, and `LightningCLI` with
`trainer_defaults` (`benchmark`, `TQDMProgressBar`,
`ModelCheckpoint(monitor="val_acc1")`), `seed_everything_default=42` and
`save_config_kwargs`. What changed: torch ops became `jax.numpy`, the
torchvision ResNet is a small flax ResNet for the 8x8 digits (sklearn's,
standing in for ImageNet's folders), torchmetrics' `Accuracy` is a line of
`jax.numpy`, and the optimizer and schedule are optax (the schedule counts
steps, as optax's do).

    python examples/lightning_imagenet.py fit --trainer.max_epochs=5
                            # ~0.92 val_acc1 in seconds
    python examples/lightning_imagenet.py test --ckpt_path=<a checkpoint>
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import torch.utils.data
from sklearn.datasets import load_digits
from torch.utils.data import Dataset, TensorDataset

import fitjax as fj
from fitjax.cli import LightningCLI


class BasicBlock(nn.Module):
    channels: int

    @nn.compact
    def __call__(self, x, train: bool):
        y = nn.Conv(self.channels, (3, 3), use_bias=False)(x)
        y = nn.relu(nn.BatchNorm(use_running_average=not train, momentum=0.9)(y))
        y = nn.Conv(self.channels, (3, 3), use_bias=False)(y)
        y = nn.BatchNorm(use_running_average=not train, momentum=0.9)(y)
        if x.shape[-1] != self.channels:
            x = nn.Conv(self.channels, (1, 1), use_bias=False)(x)
        return nn.relu(x + y)


class ResNet(nn.Module):
    """torchvision's ResNet shape, sized for 8x8 images: a stem, residual stages, pooling, a head.
    BatchNorm's `momentum=0.9` is torch's default (`momentum=0.1` there weighs the new batch)."""

    stages: tuple[int, ...] = (16, 32)
    num_classes: int = 10

    @nn.compact
    def __call__(self, x, train: bool = False):
        x = nn.relu(nn.BatchNorm(use_running_average=not train, momentum=0.9)(nn.Conv(self.stages[0], (3, 3), use_bias=False)(x)))
        for channels in self.stages:
            x = BasicBlock(channels)(x, train)
        return nn.Dense(self.num_classes)(x.mean(axis=(1, 2)))


def get_flax_model(arch: str, weights: str | None = None) -> nn.Module:
    """Lightning's `get_torchvision_model(arch, weights=...)`: the architectures by name."""
    if weights is not None:
        raise ValueError("pretrained weights are not part of this port; pass weights=None")
    return {"resnet18": ResNet((16, 32)), "resnet34": ResNet((16, 32, 64))}[arch]


def accuracy(output, target, top_k: int):
    """torchmetrics' multiclass `Accuracy(top_k=k)` for one batch."""
    top = jax.lax.top_k(output, top_k)[1]
    return (top == target[:, None]).any(axis=-1).mean()


class ImageNetLightningModel(fj.LitModule):
    def __init__(
        self,
        data_path: str = "sklearn-digits",
        arch: str = "resnet18",
        weights: str | None = None,
        lr: float = 0.1,
        momentum: float = 0.9,
        weight_decay: float = 1e-4,
        batch_size: int = 64,
        workers: int = 0,
    ):
        super().__init__()
        self.arch = arch
        self.weights = weights
        self.lr = lr
        self.momentum = momentum
        self.weight_decay = weight_decay
        self.data_path = data_path
        self.batch_size = batch_size
        self.workers = workers
        self.model = get_flax_model(self.arch, weights=self.weights)
        self.train_dataset: Dataset | None = None
        self.eval_dataset: Dataset | None = None

    def forward(self, x):
        return self.model(x, train=self.training)

    def training_step(self, batch, batch_idx):
        images, target = batch
        output = self(images)
        loss_train = optax.softmax_cross_entropy_with_integer_labels(output, target).mean()
        self.log("train_loss", loss_train)
        self.log("train_acc1", accuracy(output, target, 1), prog_bar=True)
        self.log("train_acc5", accuracy(output, target, 5), prog_bar=True)
        return loss_train

    def eval_step(self, batch, batch_idx, prefix: str):
        images, target = batch
        output = self(images)
        loss_val = optax.softmax_cross_entropy_with_integer_labels(output, target).mean()
        self.log(f"{prefix}_loss", loss_val)
        self.log(f"{prefix}_acc1", accuracy(output, target, 1), prog_bar=True)
        self.log(f"{prefix}_acc5", accuracy(output, target, 5), prog_bar=True)
        return loss_val

    def validation_step(self, batch, batch_idx):
        return self.eval_step(batch, batch_idx, "val")

    def test_step(self, batch, batch_idx):
        return self.eval_step(batch, batch_idx, "test")

    def configure_optimizers(self):
        # torch's SGD(lr, momentum, weight_decay): the decay joins the gradient before momentum
        optimizer = optax.chain(
            optax.add_decayed_weights(self.weight_decay),
            optax.inject_hyperparams(optax.sgd)(learning_rate=self.lr, momentum=self.momentum),
        )
        steps_per_epoch = self.trainer.num_training_batches  # LambdaLR steps per epoch; optax per step
        scheduler = lambda step: self.lr * 0.1 ** (step // (30 * steps_per_epoch))  # noqa: E731
        return [optimizer], [scheduler]

    def setup(self, stage: str):
        num_processes = jax.process_count()  # Lightning: the ParallelStrategy's processes
        if num_processes > 1:
            self.batch_size = int(self.batch_size / num_processes)
            self.workers = int(self.workers / num_processes)

        digits = load_digits()  # stands in for the ImageFolders under `data_path`
        images = ((digits.images / 16.0 - 0.5) / 0.5).astype(np.float32)[..., None]  # NHWC, normalised
        target = digits.target.astype(np.int64)
        order = np.random.default_rng(0).permutation(len(target))
        train, val = order[:1400], order[1400:]
        if stage == "fit":
            self.train_dataset = TensorDataset(torch.from_numpy(images[train]), torch.from_numpy(target[train]))
        # all stages will use the eval dataset
        self.eval_dataset = TensorDataset(torch.from_numpy(images[val]), torch.from_numpy(target[val]))

    def train_dataloader(self):
        return torch.utils.data.DataLoader(
            dataset=self.train_dataset,
            batch_size=self.batch_size,
            shuffle=True,
            num_workers=self.workers,
            drop_last=True,  # one batch shape: the step compiles once
        )

    def val_dataloader(self):
        return torch.utils.data.DataLoader(self.eval_dataset, batch_size=self.batch_size, num_workers=self.workers)

    def test_dataloader(self):
        return self.val_dataloader()


def main(args: list[str] | None = None, **trainer_defaults) -> LightningCLI:
    return LightningCLI(
        ImageNetLightningModel,
        trainer_defaults={
            "max_epochs": 90,
            "accelerator": "auto",
            "devices": 1,
            "logger": False,
            "benchmark": True,
            "callbacks": [
                # the PyTorch example refreshes every 10 batches
                fj.TQDMProgressBar(refresh_rate=10),
                # save when the validation top1 accuracy improves
                fj.ModelCheckpoint(monitor="val_acc1", mode="max"),
            ],
            **trainer_defaults,
        },
        seed_everything_default=42,
        save_config_kwargs={"overwrite": True},
        args=args,
    )


if __name__ == "__main__":
    main()
