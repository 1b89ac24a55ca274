"""`Trainer(runs=...)`: several runs of one fit as one program.

Each member is compared with a fit of one run with its seed and hyperparameters. The numbers
agree to float tolerance, not bitwise: vmapped, XLA computes each matrix product as one batched
product over the runs, whose summation order differs from the single run's (measured: up to
~4e-7 apart after a few steps).
"""

from __future__ import annotations

import flax.linen as nn
from flax import nnx
import jax
import numpy as np
import optax
import pytest

import fitjax as fj
from helpers import MLP, assert_trees_close, quiet_trainer, regression_data

DATA = regression_data(64)


def loader():
    return fj.DataLoader(DATA, batch_size=16, shuffle=True, seed=0)


class Decayed(fj.LitModule):
    """A regression whose learning rate (inside `optax.inject_hyperparams`) and weight decay are
    hyperparameters; BatchNorm statistics as model state. (SGD: Adam would scale the ~0 gradient
    of the bias before the BatchNorm, float noise, up to steps of the learning rate's size.)"""

    def __init__(self, lr: float = 0.05, wd: float = 0.0):
        super().__init__()
        self.save_hyperparameters()
        self.model = MLP()

    def loss(self, model, batch):
        pred = model(batch["x"], train=self.training)
        return ((pred - batch["y"]) ** 2).mean(), {"pred": pred}

    def metrics(self, batch, outputs):
        return {"mae": abs(outputs["pred"] - batch["y"]).mean()}

    def configure_optimizer(self):
        return optax.chain(optax.add_decayed_weights(self.hparams.wd),
                           optax.inject_hyperparams(optax.sgd)(learning_rate=self.hparams.lr, momentum=0.9))


def member(tree, i):
    return jax.tree.map(lambda x: np.asarray(x)[i], tree)


def single_fit(seed, **hparams):
    trainer = quiet_trainer(max_epochs=1, seed=seed)
    trainer.fit(Decayed(**hparams), loader(), loader())
    return trainer


def test_each_member_equals_its_own_fit():
    runs = [{"lr": 0.01, "wd": 0.1, "seed": 3}, {"lr": 0.05, "wd": 0.0, "seed": 4}]
    trainer = quiet_trainer(max_epochs=1, seed=3, runs=runs)
    module = Decayed()
    trainer.fit(module, loader(), loader())
    assert trainer.runs.seeds == (3, 4) and trainer.runs.names == ("seed=3,lr=0.01,wd=0.1", "seed=4,lr=0.05,wd=0")
    for i, run in enumerate(runs):
        alone = single_fit(run["seed"], lr=run["lr"], wd=run["wd"])
        assert_trees_close(member(trainer.state.params, i), alone.state.params, rtol=1e-5, atol=1e-6)
        assert_trees_close(member(trainer.state.model_state, i), alone.state.model_state, rtol=1e-5, atol=1e-6)
        for key in ("train/loss", "train/mae_epoch", "val/loss", "val/mae"):  # every logged value, per run
            np.testing.assert_allclose(trainer.callback_metrics[f"{key}/run_{i}"], alone.callback_metrics[key],
                                       rtol=1e-5)
        if i == 0:  # the module holds the first run's weights after the fit
            assert_trees_close(module.variables[0], alone.state.params, rtol=1e-5, atol=1e-6)
    assert int(trainer.state.step) == 4  # the runs step together: one count


def test_run_i_starts_as_a_fit_with_seed_plus_i():
    trainer = quiet_trainer(max_steps=0, seed=7, runs=3)  # builds the state, trains nothing
    trainer.fit(Decayed(), loader())
    assert trainer.runs.seeds == (7, 8, 9) and trainer.runs.names == ("seed=7", "seed=8", "seed=9")
    alone = quiet_trainer(max_steps=0, seed=8)
    alone.fit(Decayed(), loader())
    for got, want in zip(jax.tree.leaves(member(trainer.state.params, 1)), jax.tree.leaves(alone.state.params)):
        np.testing.assert_array_equal(got, want)  # bitwise: the same key, the same init
    kernels = np.asarray(trainer.state.params["Dense_0"]["kernel"])
    assert not np.allclose(kernels[0], kernels[2])  # each run its own initialisation


class Widths(fj.LitModule):
    """Reads `width` from `self.hparams` as a layer's size: a shape."""

    def __init__(self, lr: float = 0.05, width: int = 4):
        super().__init__()
        self.save_hyperparameters()

    def loss(self, model, batch):
        pred = nn.Dense(1)(nn.relu(nn.Dense(self.hparams.width)(batch["x"])))
        return ((pred - batch["y"]) ** 2).mean()

    def configure_optimizer(self):
        return optax.sgd(self.hparams.lr)


class WidthsModel(nn.Module):
    @nn.compact
    def __call__(self, x, width):
        return nn.Dense(1)(nn.relu(nn.Dense(width)(x)))


class WidthsFit(Widths):
    def __init__(self, lr: float = 0.05, width: int = 4):
        super().__init__(lr, width)
        self.model = WidthsModel()

    def loss(self, model, batch):
        return ((model(batch["x"], self.hparams.width) - batch["y"]) ** 2).mean()  # shape


def line_of(marker: str) -> int:
    """The line of this file that holds `marker` (a comment), for errors that name a line."""
    with open(__file__) as source:
        return next(n for n, text in enumerate(source, 1) if text.rstrip().endswith(f"# {marker}"))


def test_a_shape_changing_hyperparameter_is_refused_by_name():
    runs = [{"lr": 0.1, "width": 4}, {"lr": 0.2, "width": 8}]
    with pytest.raises(ValueError, match=r"hparams.width differs between runs and is used as a Python value in "
                                         rf"WidthsFit.loss \(line {line_of('shape')}\).*a shape"):
        quiet_trainer(max_epochs=1, runs=runs).fit(WidthsFit(), loader())


def test_a_hyperparameter_in_a_python_branch_is_refused_by_name():
    class Scheduled(Decayed):  # optax's schedule compares its peak value with 0 in Python: an `if`
        def configure_optimizer(self):
            return optax.sgd(optax.warmup_cosine_decay_schedule(0.0, self.hparams.lr, 2, 8))  # schedule

    with pytest.raises(ValueError, match=r"hparams.lr differs between runs and is used as a Python value in "
                                         rf"Scheduled.configure_optimizer \(line {line_of('schedule')}\)"):
        quiet_trainer(max_epochs=1, runs=[{"lr": 0.1}, {"lr": 0.2}]).fit(Scheduled(), loader())


class PythonValue(Decayed):
    """Uses `p` in `loss` as a Python value, as `use` says (the runs give each a traced array)."""

    use = "if"

    def __init__(self, lr: float = 0.05, wd: float = 0.0, p: float = 0.1):
        super().__init__(lr, wd)
        self.save_hyperparameters()

    def loss(self, model, batch):
        loss, outputs = super().loss(model, batch)
        p = self.hparams.p
        if self.use == "if":
            loss = loss * 2 if p > 0.2 else loss  # if
        elif self.use == "int":
            loss = loss * int(p * 10)  # int
        elif self.use == "numpy":
            loss = loss * np.asarray(p)  # numpy
        elif self.use == "nn.Dropout":  # a flax layer checks its rate in Python (`if rate == 0`)
            drop = nn.Dropout(rate=p, deterministic=False)
            dropped = drop.apply({}, outputs["pred"], rngs={"dropout": jax.random.key(0)})  # nn.Dropout
            loss = loss + dropped.mean()
        return loss, outputs


@pytest.mark.parametrize("use", ["if", "int", "numpy", "nn.Dropout"])
def test_a_hyperparameter_used_as_a_python_value_is_refused_by_name_and_line(use):
    module = PythonValue()
    module.use = use
    with pytest.raises(ValueError, match=r"^Trainer\(runs=\[...\]\): hparams.p differs between runs and is used as a "
                                         rf"Python value in PythonValue.loss \(line {line_of(use)}\):") as raised:
        quiet_trainer(max_epochs=1, runs=[{"p": 0.1}, {"p": 0.3}]).fit(module, loader())
    assert "fit one module per value of 'p'" in str(raised.value)
    if use == "if":  # the same code with `p` the same in every run: a Python value, the state is built
        quiet_trainer(max_steps=0, runs=[{"p": 0.3, "lr": 0.1}, {"p": 0.3, "lr": 0.2}]).fit(module, loader())


def test_a_hyperparameter_never_read_is_refused():
    class FixedRate(WidthsFit):
        def configure_optimizer(self):
            return optax.sgd(0.1)  # the runs' `lr` would change nothing

    with pytest.raises(ValueError, match=r"gives \['lr'\] a different value.*never read it"):
        quiet_trainer(max_epochs=1, runs=[{"lr": 0.1}, {"lr": 0.2}]).fit(FixedRate(), loader())


@pytest.mark.parametrize("runs, error, match", [
    (0, ValueError, "must be at least 1, got 0"),
    ("lr", TypeError, "takes a number of runs.*got 'lr'"),
    ([{"lr": 0.1}, {"wd": 0.1}], ValueError, r"same hyperparameters; runs\[0\] sets \['lr'\], runs\[1\] sets \['wd'\]"),
    ([{"act": "relu"}, {"act": "gelu"}], ValueError, "'act' differs between runs.*only numbers may differ"),
    ([{"lr": 0.1, "seed": 1.5}], TypeError, r"runs\[0\]\['seed'\] must be an int"),
])
def test_bad_runs_are_refused_at_the_trainer(runs, error, match):
    with pytest.raises(error, match=match):
        quiet_trainer(runs=runs)


@pytest.mark.parametrize("option, match", [
    ({"strategy": "fsdp"}, "strategy=FSDP.*'single', 'dp'.*or 'runs'"),
    ({"precision": "16-mixed"}, "precision='16-mixed'"),
    ({"detect_anomaly": True}, "detect_anomaly=True"),
    ({"update_in_backward": True}, "update_in_backward=True"),
    ({"callbacks": [fj.EMA(0.9)]}, r"callbacks that change the train step \(\['ema'\]"),
])
def test_options_that_do_not_compose_yet_are_refused_by_name(option, match):
    with pytest.raises(ValueError, match=match):
        quiet_trainer(runs=2, **option)


def test_unknown_hyperparameter_is_refused_at_fit():
    with pytest.raises(ValueError, match=r"runs\[0\] sets \['momentum'\], which Decayed's hparams do not have"):
        quiet_trainer(runs=[{"momentum": 0.1}, {"momentum": 0.2}]).fit(Decayed(), loader())


def test_each_run_draws_its_own_order_only_when_asked():
    same = fj.DataLoader(DATA, batch_size=16, shuffle=True, seed=5)
    assert fj.runs.Runs.create(2, seed=0).train_loader(same) is same  # the default: one order for all
    own = fj.runs.Runs.create(2, seed=0).train_loader(fj.DataLoader(DATA, batch_size=16, shuffle="per_run", seed=5))
    own.set_epoch(1)
    for i in range(2):  # run i's rows: the loader's order with seed 5 + i, bitwise
        alone = fj.DataLoader(DATA, batch_size=16, shuffle=True, seed=5 + i)
        alone.set_epoch(1)
        for both, one in zip(own, alone):
            np.testing.assert_array_equal(both["x"][:, i], one["x"])

    # two runs alike but for their orders: each equals a fit of one run with its order
    # (to float tolerance: vmapped products sum in another order, see the module's doc)
    trainer = quiet_trainer(max_epochs=1, runs=[{"seed": 0}, {"seed": 0}])
    trainer.fit(Decayed(), fj.DataLoader(DATA, batch_size=16, shuffle="per_run", seed=5))
    params = jax.device_get(trainer.state.params)
    assert not np.allclose(member(params, 0)["Dense_0"]["kernel"], member(params, 1)["Dense_0"]["kernel"])
    alone = quiet_trainer(max_epochs=1, seed=0)  # run 1 (run 0's order is the loader's own, seed 5)
    alone.fit(Decayed(), fj.DataLoader(DATA, batch_size=16, shuffle=True, seed=6))
    assert_trees_close(member(params, 1), alone.state.params, rtol=1e-5, atol=1e-6)


class LinearNNX(fj.LitModule):
    """An NNX model: its weights are made in `__init__`, shared by every run."""

    def __init__(self, lr: float = 0.05):
        super().__init__()
        self.save_hyperparameters()
        self.model = nnx.Linear(8, 1, rngs=nnx.Rngs(0))

    def loss(self, model, batch):
        return ((model(batch["x"]) - batch["y"]) ** 2).mean()

    def configure_optimizer(self):
        return optax.sgd(self.hparams.lr)


def test_nnx_runs_sweep_hyperparameters_and_refuse_seeds_alone():
    with pytest.raises(ValueError, match=r"runs=2\) with LinearNNX, whose model already holds weights.*Linen model"):
        quiet_trainer(max_epochs=1, runs=2).fit(LinearNNX(), loader())
    trainer = quiet_trainer(max_epochs=1, runs=[{"lr": 0.01}, {"lr": 0.05}])
    trainer.fit(LinearNNX(), loader())
    alone = quiet_trainer(max_epochs=1)
    alone.fit(LinearNNX(lr=0.05), loader())
    assert_trees_close(member(trainer.state.params, 1), alone.state.params, rtol=1e-5, atol=1e-6)
