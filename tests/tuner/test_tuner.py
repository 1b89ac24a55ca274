"""`fj.Tuner`: the batch-size finder against XLA's own memory numbers, and the learning-rate finder
against a hand-written sweep of fixed learning rates."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import Regressor, count_compiles, quiet_trainer, regression_data

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


def _swept_best_lr(data, batch_size, steps, optimizer=optax.sgd):
    """The best of fixed learning rates (quarter decades) after `steps` steps of `optimizer(lr)`, by hand."""
    model = nn.Dense(1)
    x, y = jnp.asarray(data["x"]), jnp.asarray(data["y"])
    p0 = model.init(jax.random.key(0), x[:1])

    def loss(p, xb, yb):
        return ((model.apply(p, xb) - yb) ** 2).mean()

    def run(lr):
        tx = optimizer(lr)

        def body(carry, i):
            p, opt_state = carry
            start = (i * batch_size) % len(x)
            xb, yb = jax.lax.dynamic_slice_in_dim(x, start, batch_size), jax.lax.dynamic_slice_in_dim(y, start, batch_size)
            updates, opt_state = tx.update(jax.grad(loss)(p, xb, yb), opt_state, p)
            return (optax.apply_updates(p, updates), opt_state), None

        return loss(jax.lax.scan(body, (p0, tx.init(p0)), jnp.arange(steps))[0][0], x, y)

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


def test_lr_find_without_inject_hyperparams_or_lr_schedule_says_both_ways_to_expose_the_lr():
    with pytest.raises(ValueError, match=r"holds 0 injected learning rates .* Linear has no lr_schedule.*Either return "
                                         r"e\.g\. `optax\.inject_hyperparams\(optax\.adam\)\(learning_rate=self\.hparams"
                                         r"\.lr\)` .*or set `self\.lr_schedule = self\.hparams\.lr` .*"
                                         r"`optax\.adam\(self\.lr_schedule\)`"):
        fj.Tuner(quiet_trainer()).lr_find(Linear(inject=False),
                                          fj.DataLoader(regression_data(n=64), batch_size=16), num_training=5)


class Scheduled(Linear):
    """`optax.adam(self.lr_schedule)`: the learning rate enters through the module's `lr_schedule`
    (`inject`: the same optimizer written with `optax.inject_hyperparams` instead)."""

    def __init__(self, lr_schedule=None, *, inject: bool = False, follows: bool = True):
        super().__init__()
        self.inject, self.follows = inject, follows
        if lr_schedule is not None:
            self.lr_schedule = lr_schedule

    def configure_optimizer(self):
        if self.inject:
            return optax.inject_hyperparams(optax.adam)(learning_rate=1e-3)
        return optax.adam(self.lr_schedule if self.follows else 1e-3)


_SWEEP = dict(min_lr=1e-4, max_lr=10.0, num_training=100)


@pytest.fixture(scope="module")
def adam_task():
    """The data, lr_find's results for adam through inject_hyperparams (single device and fsdp)
    and the best fixed adam learning rate of a hand-written sweep."""
    data = regression_data(n=1024, d=8)
    injected = {strategy: fj.Tuner(quiet_trainer(strategy=strategy)).lr_find(
                    Scheduled(inject=True), fj.DataLoader(data, batch_size=256, shuffle=True), **_SWEEP).results
                for strategy in ("single", "fsdp")}
    return data, injected, _swept_best_lr(data, 256, 100, optax.adam)


@pytest.mark.parametrize(("schedule", "strategy"), [
    (1e-3, "single"),
    (optax.exponential_decay(3e-2, 7, 0.5), "fsdp"),  # a rate that changes every few steps, sharded
], ids=["constant", "decaying-fsdp"])
def test_lr_find_through_the_modules_lr_schedule_equals_inject_hyperparams(adam_task, schedule, strategy):
    data, injected, best = adam_task
    trainer = quiet_trainer(strategy=strategy)
    module = Scheduled(schedule)
    with count_compiles() as compiles:
        finder = fj.Tuner(trainer).lr_find(module, fj.DataLoader(data, batch_size=256, shuffle=True), **_SWEEP)
    assert compiles["train_step"] == 1  # each rate is a value of the state, not of the program
    # the same rates and losses: each update is the schedule's rescaled by swept / lr_schedule(count),
    # which differs from the update made at the swept rate by float32 rounding (a few ulp) per step,
    # compounded over the 100 steps (measured: at most 2e-6 relative)
    np.testing.assert_array_equal(finder.results["lr"], injected[strategy]["lr"])
    np.testing.assert_allclose(finder.results["loss"], injected[strategy]["loss"], rtol=1e-5)
    assert best / 3 <= finder.suggestion() <= best * 3, (finder.suggestion(), best)
    # nothing of it reaches the module (its lr_schedule is the very same object) or the trainer
    assert module.variables is None and vars(module)["lr_schedule"] is schedule and trainer.state is None


@pytest.mark.parametrize(("module", "message"), [
    (Scheduled(1e-3, follows=False), r"lr_find imposes its learning rate through Scheduled\.lr_schedule=0\.001, but "
                                     r"Scheduled\.configure_optimizer's optimizer does not follow it: built with "
                                     r"lr_schedule at 1 and at 2, its first update did not double"),
    (Scheduled(optax.linear_schedule(0.0, 1e-2, 10)), r"lr_schedule is 0 at count 0 \(e\.g\. a warmup from 0\)"),
], ids=["ignores-it", "warmup-from-0"])
def test_lr_find_refuses_an_lr_schedule_it_cannot_impose_a_rate_through(module, message):
    schedule = module.lr_schedule
    with pytest.raises(ValueError, match=message):
        fj.Tuner(quiet_trainer()).lr_find(module, fj.DataLoader(regression_data(n=64), batch_size=16), num_training=5)
    assert vars(module)["lr_schedule"] is schedule


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
