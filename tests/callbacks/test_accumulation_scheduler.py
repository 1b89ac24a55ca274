"""GradientAccumulationScheduler: Lightning's optimizer steps and weights for the same schedules
(to float64 precision), each count compiled once, dp and fsdp as one device, exact resume across a
change of count, Lightning's errors."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import (FixedLinearFit, Regressor, assert_trees_close, count_compiles, fixed_linear_data,
                     quiet_trainer, regression_data)

import fitjax as fj
from fitjax.strategies import FSDP


pytestmark = pytest.mark.usefixtures("compile_cache")  # tests/conftest.py


# Lightning 2.6 (/work/lvenv, torch CPU), precision="64-true": a 3->1 Linear with weights
# [[0.125, -0.25, 0.375]] and bias 0.0625, x = sin(arange(48).reshape(16, 3) * 0.7),
# y = cos(arange(16) * 0.3)[:, None], batch 2 (8 batches an epoch), MSE, SGD(lr=0.1, momentum=0.9),
# max_epochs=3, callbacks=[GradientAccumulationScheduler(scheduling)]: `trainer.global_step` at each
# `on_train_epoch_end`, and the weights and bias after fit.
LIGHTNING = {
    ((0, 4), (2, 1)): ([2, 4, 12], [0.17614801035519664, -0.35832131176278087, 0.15815457160845883],
                       -1.0967521498551769),
    # 8 batches with k=3: steps over 3, 3 and the 2 left (still divided by 3)
    ((0, 3), (1, 1), (2, 4)): ([3, 11, 13], [0.19447523611366188, -0.24748955102016512, 0.30936495846393997],
                               -1.1048258229128811),
    ((1, 3),): ([8, 11, 14], [0.18529333438869142, -0.15842848234440357, 0.45478218532463743],
                0.20260499224702225),  # no key 0: epoch 0 uses 1
}


@pytest.mark.parametrize("schedule", list(LIGHTNING))
def test_steps_and_weights_match_lightning(schedule):
    steps = []
    record = fj.LambdaCallback(on_train_epoch_end=lambda trainer, module: steps.append(trainer.global_step))
    trainer = quiet_trainer(max_epochs=3, precision="64-true", strategy="single",
                            callbacks=[record, fj.GradientAccumulationScheduler(dict(schedule))])
    trainer.fit(FixedLinearFit(), fj.DataLoader(fixed_linear_data(), batch_size=2))
    expected_steps, kernel, bias = LIGHTNING[schedule]
    assert steps == expected_steps
    dense = trainer.state.params["Dense_0"]
    np.testing.assert_allclose(np.asarray(dense["kernel"]).ravel(), kernel, rtol=1e-13)
    np.testing.assert_allclose(float(dense["bias"][0]), bias, rtol=1e-13)
    assert trainer.accumulate_grad_batches == dict(schedule).get(2, dict(schedule).get(1, 1))


def test_each_count_compiles_once():
    def compiles(scheduling):
        trainer = quiet_trainer(max_epochs=3, strategy="single",
                                callbacks=[fj.GradientAccumulationScheduler(scheduling)])
        with count_compiles() as counts:
            trainer.fit(Regressor(batchnorm=False), fj.DataLoader(regression_data(n=64), batch_size=8))
        return counts["train_step"]

    # going back to 4 in epoch 2 reuses epoch 0's program: as many as a schedule that never returns
    assert compiles({0: 4, 1: 1, 2: 4}) == compiles({0: 4, 1: 1}) == 2


def test_under_dp_and_fsdp_equals_one_device():
    def fit(strategy):
        trainer = quiet_trainer(max_epochs=3, strategy=strategy,
                                callbacks=[fj.GradientAccumulationScheduler({0: 2, 1: 4, 2: 1})])
        trainer.fit(Regressor(batchnorm=False), fj.DataLoader(regression_data(n=128), batch_size=16, shuffle=True))
        return trainer

    single = fit("single")
    for strategy in ("dp", FSDP(min_size_to_shard=8)):
        sharded = fit(strategy)
        assert single.global_step == sharded.global_step == 4 + 2 + 8
        assert_trees_close(sharded.state.params, single.state.params, rtol=1e-5, atol=1e-6)


def test_resume_across_a_change_of_count_equals_an_uninterrupted_run(tmp_path):
    def fit(max_steps, ckpt_path=None):
        trainer = quiet_trainer(max_steps=max_steps, strategy="single", enable_checkpointing=True,
                                callbacks=[fj.GradientAccumulationScheduler({0: 4, 1: 1}),
                                           fj.ModelCheckpoint(tmp_path, save_last=True, every_n_train_steps=2)])
        trainer.fit(Regressor(), fj.DataLoader(regression_data(n=64), batch_size=16, shuffle=True),
                    ckpt_path=ckpt_path)
        return trainer

    full = quiet_trainer(max_steps=5, strategy="single", callbacks=[fj.GradientAccumulationScheduler({0: 4, 1: 1})])
    full.fit(Regressor(), fj.DataLoader(regression_data(n=64), batch_size=16, shuffle=True))
    fit(2)  # epoch 0 is one step of 4 batches; the save is after epoch 1's first step (of 1 batch)
    resumed = fit(5, ckpt_path="last")
    assert resumed.global_step == full.global_step == 5
    assert_trees_close(resumed.state.params, full.state.params, rtol=0, atol=0)
    assert_trees_close(resumed.state.model_state, full.state.model_state, rtol=0, atol=0)


def test_lightning_errors():
    with pytest.raises(ValueError, match="You have set `accumulate_grad_batches` and are using the "
                                         "`GradientAccumulationScheduler`"):
        fj.Trainer(accumulate_grad_batches=2, callbacks=[fj.GradientAccumulationScheduler({0: 2})])
    with pytest.raises(TypeError, match=r"non-empty dict.*\{\}"):
        fj.GradientAccumulationScheduler({})
    with pytest.raises(ValueError, match=r"epochs \(keys\) must be ints >= 0.*-1"):
        fj.GradientAccumulationScheduler({-1: 2})
    with pytest.raises(ValueError, match=r"factors \(values\) must be ints >= 1.*0"):
        fj.GradientAccumulationScheduler({0: 0})
    assert fj.GradientAccumulationScheduler({3: 2}).get_accumulate_grad_batches(2) == 1
