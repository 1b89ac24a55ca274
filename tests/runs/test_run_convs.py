"""On XLA:CPU, a convolution whose input and kernel both hold the runs is computed as one
convolution per run (`fitjax.step.xla_cpu.runs_vmap`), not as `vmap`'s grouped convolution (slow
there): the program holds no grouped convolution, and each run equals a fit of one run."""

from __future__ import annotations

import re

import flax.linen as nn
import jax
import numpy as np
import optax
from helpers import assert_trees_close, quiet_trainer

import fitjax as fj
from fitjax.step import StepOptions, xla_cpu


RNG = np.random.default_rng(0)
IMAGES = RNG.normal(size=(32, 6, 6, 1)).astype(np.float32)
DATA = {"image": IMAGES, "y": IMAGES.mean(axis=(1, 2))}


class ConvNet(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(4, (3, 3))(x))  # the kernel holds the runs, the batch does not
        x = nn.relu(nn.Conv(4, (3, 3), strides=(2, 2))(x))  # both hold them
        return nn.Dense(1)(x.reshape(x.shape[0], -1))


class Convs(fj.LitModule):
    def __init__(self, lr: float = 0.05):
        super().__init__()
        self.save_hyperparameters()
        self.model = ConvNet()

    def loss(self, model, batch):
        return ((model(batch["image"]) - batch["y"]) ** 2).mean()

    def configure_optimizer(self):
        return optax.sgd(self.hparams.lr, momentum=0.9)


def loader():
    return fj.DataLoader(DATA, batch_size=16, shuffle=True, seed=0)


def test_conv_runs_hold_no_grouped_convolution_and_equal_single_fits():
    strategy = fj.strategies.SingleDevice()
    strategy.setup(jax.devices()[:1])
    batch = {k: v[:16] for k, v in DATA.items()}
    state, compiled = fj.runs.Runs.create(2, seed=0).build(Convs(), strategy, batch, options=StepOptions())
    text = compiled.train_step.lower(state, batch).as_text()
    convs = re.findall(r"stablehlo.convolution.*", text)
    # forward: 2 layers; backward: the first layer's kernel, the second's kernel and input
    assert len(convs) >= 5
    groups = {int(n) for conv in convs for n in re.findall(r"(?:feature|batch)_group_count = (\d+)", conv)}
    assert groups == {1}, convs

    trainer = quiet_trainer(max_epochs=1, runs=2, seed=0, strategy="single")
    trainer.fit(Convs(), loader())
    for i in range(2):
        alone = quiet_trainer(max_epochs=1, seed=i, strategy="single")
        alone.fit(Convs(), loader())
        assert_trees_close(fj.runs.member(trainer.state.params, i), alone.state.params, rtol=1e-5, atol=1e-6)


def test_only_the_runs_axis_computes_convolutions_per_run():
    assert xla_cpu.runs_vmap(platform="gpu") is jax.vmap
    assert xla_cpu.runs_vmap(platform="cpu", sharded=True) is jax.vmap  # split over devices: grouped there

    def conv(x, w):
        return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))

    x, w = np.ones((3, 2, 5, 5, 4), np.float32), np.ones((3, 3, 3, 4, 8), np.float32)
    runs = str(jax.make_jaxpr(xla_cpu.runs_vmap(platform="cpu")(conv))(x, w))
    assert runs.count("conv_general_dilated") == 3 and "feature_group_count=3" not in runs
    own = str(jax.make_jaxpr(jax.vmap(conv))(x, w))  # a vmap of the user's own keeps JAX's rule
    assert own.count("conv_general_dilated") == 1 and "feature_group_count=3" in own
    np.testing.assert_allclose(xla_cpu.runs_vmap(platform="cpu")(conv)(x, w), jax.vmap(conv)(x, w), rtol=1e-6)
