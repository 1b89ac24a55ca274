"""`fj.Tuner`: the batch-size finder against XLA's own memory numbers, and the learning-rate finder
against a hand-written sweep of fixed learning rates."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import Regressor, quiet_trainer, regression_data

import fitjax as fj


class Linear(fj.LitModule):
    """Least squares with plain SGD: the learning rate enters through `optax.inject_hyperparams`."""

    def __init__(self, inject: bool = True, schedule: bool = False):
        super().__init__()
        self.inject, self.schedule = inject, schedule
        self.model = nn.Dense(1)

    def loss(self, model, batch):
        return ((model(batch["x"]) - batch["y"]) ** 2).mean()

    def configure_optimizer(self):
        if self.schedule:  # what configure_optimizers' 'lr_scheduler' builds too
            return optax.inject_hyperparams(optax.sgd)(learning_rate=optax.linear_schedule(1e-3, 1e-4, 100))
        return optax.inject_hyperparams(optax.sgd)(learning_rate=1e-3) if self.inject else optax.sgd(1e-3)


def _swept_best_lr(data, batch_size, steps):
    """The best of fixed learning rates (quarter decades) after `steps` SGD steps, by hand."""
    model = nn.Dense(1)
    x, y = jnp.asarray(data["x"]), jnp.asarray(data["y"])
    p0 = model.init(jax.random.key(0), x[:1])

    def loss(p, xb, yb):
        return ((model.apply(p, xb) - yb) ** 2).mean()

    def run(lr):
        def body(p, i):
            start = (i * batch_size) % len(x)
            xb, yb = jax.lax.dynamic_slice_in_dim(x, start, batch_size), jax.lax.dynamic_slice_in_dim(y, start, batch_size)
            return jax.tree.map(lambda a, g: a - lr * g, p, jax.grad(loss)(p, xb, yb)), None

        return loss(jax.lax.scan(body, p0, jnp.arange(steps))[0], x, y)

    grid = 10.0 ** np.arange(-4, 0.01, 0.25)
    final = np.asarray(jax.jit(jax.vmap(run))(jnp.asarray(grid, jnp.float32)))
    return float(grid[np.nanargmin(np.where(np.isfinite(final), final, np.inf))])


def test_lr_find_suggests_within_3x_of_the_best_fixed_lr_and_plots_a_png(tmp_path):
    data = regression_data(n=1024, d=8)
    trainer = quiet_trainer(default_root_dir=str(tmp_path))
    module = Linear()
    finder = fj.Tuner(trainer).lr_find(module, fj.DataLoader(data, batch_size=256, shuffle=True),
                                       min_lr=1e-4, max_lr=10.0, num_training=100)
    suggested = finder.suggestion()
    best = _swept_best_lr(data, 256, 100)
    assert best / 3 <= suggested <= best * 3, (suggested, best)
    assert len(finder.results["lr"]) == len(finder.results["loss"]) <= 100
    assert np.all(np.diff(finder.results["lr"]) > 0)
    # stopped early once the loss blew up, as Lightning does
    assert finder.results["lr"][-1] < 10.0
    # a copy of the state: the module and trainer are as they were
    assert module.variables is None and trainer.state is None

    fig = finder.plot(suggest=True)
    assert fig.axes and finder.plot_path == str(tmp_path / "lr_find.png")
    with open(finder.plot_path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_lr_find_without_inject_hyperparams_says_how_to_expose_the_lr():
    with pytest.raises(ValueError, match=r"optax.inject_hyperparams\(optax.adam\)\(learning_rate="):
        fj.Tuner(quiet_trainer()).lr_find(Linear(inject=False),
                                          fj.DataLoader(regression_data(n=64), batch_size=16), num_training=5)


def test_lr_find_refuses_a_schedule_that_would_override_its_lr():
    with pytest.raises(ValueError, match=r"set the learning rate to 1e-08, but Linear's optimizer used 0.001: a "
                                         r"schedule sets it"):
        fj.Tuner(quiet_trainer()).lr_find(Linear(schedule=True),
                                          fj.DataLoader(regression_data(n=64), batch_size=16), num_training=5)


class Data(fj.DataModule):
    def __init__(self):
        self.batch_size = 16

    def train_dataloader(self):
        return fj.DataLoader(regression_data(n=256), batch_size=self.batch_size)


def test_scale_batch_size_fits_the_budget_and_the_next_size_does_not():
    """dp on 8 devices with accumulation: candidates are multiples of 8, bytes are per device."""
    trainer = quiet_trainer(strategy="dp", accumulate_grad_batches=2)
    tuner = fj.Tuner(trainer)
    # power mode doubles while the step fits: here twice, under a budget nothing reaches
    assert tuner.scale_batch_size(Linear(), datamodule=Data(), mode="power", init_val=32, max_trials=2,
                                  max_memory_bytes=1 << 40) == 64
    trials = tuner.batch_size_trials  # XLA's memory_analysis() of each compiled candidate
    assert trials[32] < trials[64]
    budget = (trials[32] + trials[64]) // 2
    dm = Data()
    size = tuner.scale_batch_size(Linear(), datamodule=dm, mode="binsearch", init_val=32, max_memory_bytes=budget)
    trials = tuner.batch_size_trials
    assert 32 <= size < 64 and size % 8 == 0 and dm.batch_size == size
    assert trials[size] <= budget < trials[size + 8]
    assert trainer.state is None


def test_scale_batch_size_on_cpu_needs_a_budget():
    with pytest.raises(ValueError, match=r"reports no memory limit.*pass max_memory_bytes="):
        fj.Tuner(quiet_trainer()).scale_batch_size(Regressor(), fj.DataLoader(regression_data(n=64), batch_size=16))
    with pytest.raises(ValueError, match=r"mode=...\) got 'linear'"):
        fj.Tuner(quiet_trainer()).scale_batch_size(Regressor(), fj.DataLoader(regression_data(n=64), batch_size=16),
                                                   mode="linear", max_memory_bytes=1 << 20)
