"""The step layer reads a module only through its `ModuleSpec` (`LitModule.step_spec()`): a spec
made by hand from plain functions, with no `LitModule` behind it, builds the same programs and
gives the same numbers as the module it copies."""

from __future__ import annotations

import contextlib

import jax
import numpy as np
import optax
from helpers import MLP, Regressor, quiet_trainer, regression_data

from fitjax import metrics as acc_lib
from fitjax import step as step_lib
from fitjax.step.model_binding import bind


def _hand_made_spec(modes: list) -> step_lib.ModuleSpec:
    """`Regressor(batchnorm=True)`'s recipe as plain functions; `modes` records each mode set."""
    flags = {"training": False}

    @contextlib.contextmanager
    def mode(training: bool):
        modes.append(training)
        previous, flags["training"] = flags["training"], training
        try:
            yield
        finally:
            flags["training"] = previous

    def loss(model, batch):
        pred = model(batch["x"], train=flags["training"])
        return ((pred - batch["y"]) ** 2).mean(), {"pred": pred}

    return step_lib.ModuleSpec(
        owner="Plain", binding=bind(MLP(batchnorm=True), rng_streams=("dropout",), owner="Plain"), variables=None,
        loss=loss, metrics=lambda batch, outputs: {"mae": abs(outputs["pred"] - batch["y"]).mean()},
        predict=lambda model, batch: model(batch["x"], train=False),
        optimizer=lambda: optax.sgd(0.05, momentum=0.9), lr_schedule=lambda: None, manual=False,
        eval_stages=("val",), mode=mode, defined_at={"loss": "", "metrics": ""})


def _run(spec, strategy, batches):
    state, compiled = step_lib.build(spec, strategy, batches[0], seed=0)
    losses = []
    for batch in batches:
        state, values = compiled.train_step(state, batch)
        losses.append(float(values["loss"]))
    eval_step, names = compiled.evaluator("val")[:2]
    acc = acc_lib.zeros(names)
    acc, values = eval_step(state.params, state.model_state, state.rng, acc, batches[0], np.ones(16, bool),
                             np.int32(0))
    predictions = compiled.predict_step(state.params, state.model_state, state.rng, batches[0])
    return losses, state, jax.device_get(values), np.asarray(predictions)


def test_a_spec_made_by_hand_trains_evaluates_and_predicts_like_the_module_it_copies():
    data = regression_data(n=96)
    batches = [{k: v[i:i + 16] for k, v in data.items()} for i in range(0, 96, 16)]
    strategy = quiet_trainer(strategy="single").strategy
    modes: list[bool] = []
    module = _run(Regressor(batchnorm=True).step_spec(), strategy, batches)
    plain = _run(_hand_made_spec(modes), strategy, batches)

    assert plain[0] == module[0]  # the same losses, bitwise
    assert plain[0][-1] < plain[0][0] / 2
    for a, b in zip(jax.tree.leaves((plain[1].params, plain[1].model_state, plain[1].opt_state)),
                    jax.tree.leaves((module[1].params, module[1].model_state, module[1].opt_state))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert plain[2] == module[2] and set(plain[2]) == {"loss", "mae"}
    np.testing.assert_array_equal(plain[3], module[3])
    # train (and the Linen init) in train mode, evaluation and predict in eval mode
    assert True in modes and False in modes
