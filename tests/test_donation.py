"""The train step donates its state, except on CPU for a step whose scratch dwarfs its state."""

from __future__ import annotations

import flax.linen as nn
import jax
import optax
import pytest
from helpers import assert_trees_close, count_compiles, quiet_trainer, regression_data

import fitjax as fj
from fitjax import _donation

MiB = 1 << 20


@pytest.mark.parametrize("platform, temp, state, largest, expected", [
    ("cpu", 1 * MiB, 3 * MiB, 1 * MiB, True),  # MNIST-sized MLP: small scratch
    ("cpu", 135 * MiB, 10 * MiB, 3 * MiB, False),  # small CNN: scratch page-faulted every step
    ("cpu", 135 * MiB, 40 * MiB, 3 * MiB, True),  # not donating would add 30% memory
    ("cpu", 135 * MiB, 30 * MiB, 32 * MiB, True),  # an undonated output that large is faulted too
    ("gpu", 135 * MiB, 10 * MiB, 3 * MiB, True),  # only XLA:CPU mallocs its scratch per call
])
def test_rule(platform, temp, state, largest, expected):
    assert _donation.donates(platform=platform, temp_bytes=temp, state_bytes=state,
                             largest_leaf_bytes=largest) is expected


class Wide(nn.Module):
    """2048 hidden units over batches of 4096: ~100 MiB of scratch per step, 70 KiB of state."""

    @nn.compact
    def __call__(self, x):
        return nn.Dense(1)(nn.relu(nn.Dense(2048)(x)))


class WideRegressor(fj.LitModule):
    def __init__(self, width_model: nn.Module):
        super().__init__()
        self.model = width_model

    def loss(self, model, batch):
        return ((model(batch["x"]) - batch["y"]) ** 2).mean()

    def configure_optimizer(self):
        return optax.adam(1e-3)


class DonationSeen(fj.Callback):
    """Whether the state a step was given was donated (its buffers deleted) by that step."""

    def __init__(self):
        self.donated = []

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self._before = jax.tree.leaves(trainer.state.params)

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.donated.append(all(leaf.is_deleted() for leaf in self._before))


def _fit(model: nn.Module, data, batch_size: int, **kwargs):
    seen = DonationSeen()
    module = WideRegressor(model)
    trainer = quiet_trainer(max_epochs=2, callbacks=[seen], seed=0, strategy="single", **kwargs)
    with count_compiles() as compiles:
        trainer.fit(module, fj.DataLoader(data, batch_size=batch_size))
    return module, seen.donated, compiles


def test_large_scratch_small_state_is_not_donated_on_cpu(monkeypatch):
    data = regression_data(n=8192, d=8)
    module, donated, compiles = _fit(Wide(), data, 4096)
    assert donated == [False] * 4
    assert compiles["train_step"] == 2  # the donated program, measured once, and the one that runs
    # the same numbers as when the step donates: both compile the same computation
    monkeypatch.setattr(_donation, "donates", lambda **sizes: True)
    reference, donated, _ = _fit(Wide(), data, 4096)
    assert donated == [True] * 4
    assert_trees_close(module.variables, reference.variables)


def test_small_step_is_donated():
    class Narrow(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(1)(nn.relu(nn.Dense(32)(x)))

    _, donated, compiles = _fit(Narrow(), regression_data(n=256, d=8), 64)
    assert donated == [True] * 8
    assert compiles["train_step"] == 1
