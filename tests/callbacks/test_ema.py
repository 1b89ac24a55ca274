"""EMA of the parameters inside the jitted step: the average computed by hand, under every strategy
with accumulation and bf16-mixed; eval on the average; a resume bitwise equal to one run."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from helpers import Regressor, assert_trees_close, quiet_trainer, regression_data

import fitjax as fj
from fitjax.module import set_variables
from fitjax.strategies import FSDP

DECAY = 0.8  # far from 1: after a few steps the average differs clearly from the params


pytestmark = pytest.mark.usefixtures("compile_cache")  # tests/conftest.py


class ParamsHistory(fj.Callback):
    """The params after every optimizer step (a host copy per step: affordable in a test)."""

    def __init__(self):
        self.params = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step > len(self.params):
            self.params.append(jax.device_get(trainer.state.params))


def _by_hand(history, *, decay, every):
    avg = None
    for i, params in enumerate(history):
        if i % every:
            continue
        if avg is None:  # the first update copies (torch's AveragedModel)
            avg = jax.tree.map(lambda p: np.asarray(p, np.float32), params)
        else:
            avg = jax.tree.map(lambda a, p: decay * a + (1 - decay) * np.asarray(p, np.float32), avg, params)
    return avg


@pytest.mark.parametrize("strategy", ["single", "dp", "fsdp"])
def test_ema_is_the_average_by_hand_with_accumulation_and_bf16(strategy):
    history = ParamsHistory()
    every = 2
    strategy_obj = FSDP(min_size_to_shard=8) if strategy == "fsdp" else strategy
    trainer = quiet_trainer(max_steps=7, strategy=strategy_obj, accumulate_grad_batches=2, precision="bf16-mixed",
                            callbacks=[history, fj.EMA(decay=DECAY, every_n_steps=every)])
    module = Regressor(batchnorm=False)
    trainer.fit(module, fj.DataLoader(regression_data(n=256), batch_size=16))
    assert len(history.params) == 7
    ema = trainer.state.extras["ema"]
    assert_trees_close(ema, _by_hand(history.params, decay=DECAY, every=every), rtol=1e-6, atol=1e-7)
    # sharded like the parameters (fsdp splits the kernels over the devices)
    for avg, p in zip(jax.tree.leaves(ema), jax.tree.leaves(trainer.state.params)):
        assert avg.sharding.is_equivalent_to(p.sharding, p.ndim)
    if strategy == "fsdp":
        assert any(len(a.sharding.device_set) == 8 and not a.sharding.is_fully_replicated
                   for a in jax.tree.leaves(ema))
    # the module keeps the last params unless asked for the average
    assert_trees_close(module.variables[0], trainer.state.params, rtol=0, atol=0)


def test_eval_uses_the_average_and_the_module_gets_it_on_request():
    data = regression_data(n=128)
    val = fj.DataLoader(regression_data(n=64, seed=1), batch_size=32)
    trainer = quiet_trainer(max_steps=6, callbacks=[fj.EMA(decay=DECAY, apply_to_module=True)])
    module = Regressor(batchnorm=False)
    trainer.fit(module, fj.DataLoader(data, batch_size=16), val)
    assert_trees_close(module.variables[0], trainer.state.extras["ema"], rtol=0, atol=0)
    with_ema = trainer.validate(module, val)[0]["val/loss"]
    # the same weights evaluated by a trainer without EMA
    plain = quiet_trainer().validate(module, val)[0]["val/loss"]
    assert with_ema == plain
    last = Regressor(batchnorm=False)
    set_variables(last, trainer.state.params, trainer.state.model_state)
    assert quiet_trainer().validate(last, val)[0]["val/loss"] != with_ema
    # predict too
    np.testing.assert_array_equal(trainer.predict(module, val), quiet_trainer().predict(module, val))
    # fit's own validation ran on the average as well (logged as val/loss)
    assert trainer.callback_metrics["val/loss"] == with_ema


def test_resumed_run_with_ema_equals_an_uninterrupted_one_bitwise(tmp_path):
    def fit(folder, max_steps, ckpt_path=None):
        trainer = quiet_trainer(max_steps=max_steps, strategy="dp", enable_checkpointing=True,
                                callbacks=[fj.EMA(decay=DECAY), fj.ModelCheckpoint(folder, every_n_train_steps=3)])
        trainer.fit(Regressor(), fj.DataLoader(regression_data(n=128), batch_size=16, shuffle=True),
                    ckpt_path=ckpt_path)
        return trainer

    full = fit(tmp_path / "full", 7)
    fit(tmp_path / "cut", 3)
    resumed = fit(tmp_path / "cut", 7, ckpt_path="last")
    assert_trees_close(resumed.state.extras, full.state.extras, rtol=0, atol=0)
    assert_trees_close(resumed.state.params, full.state.params, rtol=0, atol=0)


@pytest.mark.parametrize("use_for_eval", [True, False])
def test_a_checkpoint_evaluates_and_loads_what_validation_used(tmp_path, use_for_eval):
    # Lightning's WeightAveraging saves the average as the model's weights: validate/test/predict
    # (ckpt_path=...) and load_from_checkpoint give what fit's validation saw (here monitored)
    val = fj.DataLoader(regression_data(n=64, seed=1), batch_size=32)
    saver = fj.ModelCheckpoint(tmp_path, monitor="val/loss", save_top_k=1)
    trainer = quiet_trainer(max_epochs=2, enable_checkpointing=True, strategy="fsdp",
                            callbacks=[fj.EMA(decay=DECAY, use_for_eval=use_for_eval), saver])
    module = Regressor(batchnorm=False)
    trainer.fit(module, fj.DataLoader(regression_data(n=128), batch_size=16), val)
    best = saver.best_model_score
    stands_in = jax.device_get(trainer.state.extras["ema"] if use_for_eval else trainer.state.params)
    assert trainer.validate(module, val, ckpt_path="best")[0]["val/loss"] == pytest.approx(best, rel=1e-6)
    loaded = Regressor.load_from_checkpoint(saver.best_model_path)
    assert_trees_close(loaded.variables[0], stands_in, rtol=0, atol=0)  # the last epoch is the best here
    assert quiet_trainer().validate(loaded, val)[0]["val/loss"] == pytest.approx(best, rel=1e-6)
    np.testing.assert_array_equal(trainer.predict(module, val, ckpt_path="best"), quiet_trainer().predict(loaded, val))
    # a resume restores both: the trained params go on training, the average goes on averaging
    resumed = quiet_trainer(max_epochs=3, enable_checkpointing=True, strategy="fsdp",
                            callbacks=[fj.EMA(decay=DECAY, use_for_eval=use_for_eval),
                                       fj.ModelCheckpoint(tmp_path / "more")])
    resumed.fit(Regressor(batchnorm=False), fj.DataLoader(regression_data(n=128), batch_size=16),
                ckpt_path=saver.best_model_path)
    assert resumed.global_step == trainer.global_step + 8


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match=r"EMA\(decay=...\).*got 1.5"):
        fj.EMA(decay=1.5)
    with pytest.raises(ValueError, match=r"EMA\(every_n_steps=...\).*got 0"):
        fj.EMA(every_n_steps=0)
    with pytest.raises(ValueError, match="two step pieces are named 'ema'"):
        quiet_trainer(callbacks=[fj.EMA(), fj.EMA()])
