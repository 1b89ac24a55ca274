"""BaseFinetuning / BackboneFinetuning: Lightning's weights after an unfreeze (float64), one
compile, frozen groups' optimizer state untouched, dp and fsdp as one device, bitwise resume
across the unfreeze epoch, clear errors."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import assert_trees_close, count_compiles, quiet_trainer

import fitjax as fj
from fitjax.strategies import FSDP


pytestmark = pytest.mark.usefixtures("compile_cache")  # tests/conftest.py


_RNG = np.random.default_rng(0)
X, Y = _RNG.normal(size=(16, 4)), _RNG.normal(size=(16, 1))
# Lightning builds the module in float32 and casts it to float64: the weights as float32 values
W1, W2 = ((_RNG.normal(size=shape) * 0.5).astype(np.float32).astype(np.float64) for shape in ((4, 3), (3, 1)))

# Lightning 2.6 (/work/lvenv, torch CPU), precision="64-true": `backbone = Linear(4, 3)` (weight
# W1.T, bias 0), `head = Linear(3, 1)` (weight W2.T, bias 0), loss mean((head(tanh(backbone(x))) - y)^2)
# on X, Y above, batch 4 (4 batches an epoch, no shuffling), SGD(filter(requires_grad, params), lr=0.1),
# max_epochs=4, BackboneFinetuning(unfreeze_backbone_at_epoch=2, lambda_func=lambda e: 2.0,
# backbone_initial_ratio_lr=0.25) (backbone rates 0, 0, 0.025, 0.05): the parameters after fit.
LIGHTNING = {
    "backbone_weight": [[0.0938618403703274, -0.5368242958634417, 0.29113454258435817, 0.8461297131218702],
                        [-0.3729034074130563, -0.6205272326085095, 0.6294259115746303, -0.16685854627865132],
                        [-0.16049154744814334, 0.3202801255679912, -0.36466375702054027, 0.7984334945403208]],
    "backbone_bias": [-6.352026125169015e-05, 0.015940420330709772, -0.008178601392367427],
    "head_weight": [[-0.0251202560241155, 0.36364960860165546, -0.2146793553121912]],
    "head_bias": [0.3446472188995975],
}


class _Net(nn.Module):
    def setup(self):
        self.backbone = nn.Dense(3, kernel_init=lambda *_: jnp.asarray(W1), bias_init=nn.initializers.zeros)
        self.head = nn.Dense(1, kernel_init=lambda *_: jnp.asarray(W2), bias_init=nn.initializers.zeros)

    def __call__(self, x):
        return self.head(jnp.tanh(self.backbone(x)))


class _Fit(fj.LitModule):
    def __init__(self, momentum=None):
        super().__init__()
        self.model, self.momentum = _Net(), momentum

    def loss(self, model, batch):
        return ((model(batch["x"]) - batch["y"]) ** 2).mean()

    def configure_optimizer(self):
        return optax.sgd(0.1, momentum=self.momentum)


def _loader(shuffle=False):
    return fj.DataLoader({"x": X, "y": Y}, batch_size=4, shuffle=shuffle)


def _callback(**kwargs):
    return fj.BackboneFinetuning(unfreeze_backbone_at_epoch=2, lambda_func=lambda e: 2.0,
                                 backbone_initial_ratio_lr=0.25, **kwargs)


def test_weights_match_lightning_and_compile_once(capsys):
    trainer = quiet_trainer(max_epochs=4, precision="64-true", strategy="single", callbacks=[_callback(verbose=True)])
    with count_compiles() as counts:
        trainer.fit(_Fit(), _loader())
    assert counts["train_step"] == 1
    params = jax.device_get(trainer.state.params)
    np.testing.assert_allclose(params["backbone"]["kernel"].T, LIGHTNING["backbone_weight"], rtol=1e-12)
    np.testing.assert_allclose(params["backbone"]["bias"], LIGHTNING["backbone_bias"], rtol=1e-10, atol=1e-15)
    np.testing.assert_allclose(params["head"]["kernel"].T, LIGHTNING["head_weight"], rtol=1e-12)
    np.testing.assert_allclose(params["head"]["bias"], LIGHTNING["head_bias"], rtol=1e-12)
    assert trainer.callbacks[[type(c) for c in trainer.callbacks].index(fj.BackboneFinetuning)].table == [
        {"backbone": 0.0, "head": 1.0}, {"backbone": 0.0, "head": 1.0},
        {"backbone": 0.25, "head": 1.0}, {"backbone": 0.5, "head": 1.0}]
    # Lightning's verbose lines (base rate 1.0: optax.sgd(0.1) does not expose it, so rates are relative)
    assert [line for line in capsys.readouterr().out.splitlines() if line.startswith("Current lr")] == [
        "Current lr: 1.0, Backbone lr: 0.25", "Current lr: 1.0, Backbone lr: 0.5"]


def test_frozen_group_and_its_momentum_do_not_change():
    trainer = quiet_trainer(max_epochs=2, strategy="single",
                            callbacks=[fj.BackboneFinetuning(unfreeze_backbone_at_epoch=5)])
    class Decayed(_Fit):  # weight decay feeds the momentum even without a gradient: kept as it was
        def configure_optimizer(self):
            return optax.chain(optax.add_decayed_weights(0.1), optax.sgd(0.1, momentum=0.9))

    trainer.fit(Decayed(), _loader())
    params, trace = trainer.state.params, trainer.state.opt_state[1][0].trace
    np.testing.assert_array_equal(np.asarray(params["backbone"]["kernel"]), W1.astype(np.float32))
    assert not np.asarray(trace["backbone"]["kernel"]).any() and np.asarray(trace["head"]["kernel"]).any()


def test_dp_and_fsdp_equal_one_device():
    def fit(strategy):
        trainer = quiet_trainer(max_epochs=4, strategy=strategy, callbacks=[_callback()])
        trainer.fit(_Fit(momentum=0.9), fj.DataLoader({"x": np.tile(X, (2, 1)), "y": np.tile(Y, (2, 1))},
                                                      batch_size=8, shuffle=True))
        return trainer.state.params

    single = fit("single")
    for strategy in ("dp", FSDP(min_size_to_shard=2)):
        assert_trees_close(fit(strategy), single, rtol=1e-5, atol=1e-6)


def test_resume_across_the_unfreeze_epoch_is_bitwise(tmp_path):
    def fit(max_steps, ckpt_path=None, save=True):
        extra = [fj.ModelCheckpoint(tmp_path, save_last=True, every_n_train_steps=3)] if save else []
        trainer = quiet_trainer(max_steps=max_steps, strategy="single", enable_checkpointing=save,
                                callbacks=[_callback(), *extra])
        trainer.fit(_Fit(momentum=0.9), _loader(shuffle=True), ckpt_path=ckpt_path)
        return trainer

    full = fit(14, save=False)
    fit(6)  # saved after step 6: mid epoch 1, the backbone still frozen; epoch 2 unfreezes it
    resumed = fit(14, ckpt_path="last")
    assert resumed.global_step == 14
    assert_trees_close(resumed.state.params, full.state.params, rtol=0, atol=0)
    assert_trees_close(resumed.state.opt_state, full.state.opt_state, rtol=0, atol=0)


def test_base_finetuning_subclass_and_errors():
    class Unfreeze(fj.BaseFinetuning):
        def freeze_before_training(self, pl_module):
            self.freeze(["backbone", "head"])

        def finetune_function(self, pl_module, epoch, optimizer):
            if epoch == 1:
                self.unfreeze_and_add_param_group("head", optimizer, initial_denom_lr=4.0)

    trainer = quiet_trainer(max_epochs=2, strategy="single", callbacks=[Unfreeze()])
    trainer.fit(_Fit(), _loader())
    assert trainer.callbacks[[type(c) for c in trainer.callbacks].index(Unfreeze)].table == [
        {"backbone": 0.0, "head": 0.0}, {"backbone": 0.0, "head": 0.25}]
    np.testing.assert_array_equal(np.asarray(trainer.state.params["backbone"]["kernel"]), W1.astype(np.float32))

    class Wrong(Unfreeze):
        def freeze_before_training(self, pl_module):
            self.freeze("encoder")

    with pytest.raises(ValueError, match=r"\['encoder'\] are not top-level keys.*'backbone', 'head'"):
        quiet_trainer(max_epochs=1, strategy="single", callbacks=[Wrong()]).fit(_Fit(), _loader())
    with pytest.raises(ValueError, match="unfreeze_backbone_at_epoch"):
        fj.BackboneFinetuning(unfreeze_backbone_at_epoch=-1)


@pytest.mark.parametrize("train_bn", [True, False])
def test_train_bn_false_keeps_a_frozen_groups_batchnorm_statistics(train_bn):
    from helpers import Regressor, regression_data

    class FreezeNorm(fj.BaseFinetuning):
        def freeze_before_training(self, pl_module):
            self.freeze("BatchNorm_0", train_bn=train_bn)

        def finetune_function(self, pl_module, epoch, optimizer):
            pass

    trainer = quiet_trainer(max_epochs=1, strategy="single", callbacks=[FreezeNorm()])
    module = Regressor()
    trainer.fit(module, fj.DataLoader(regression_data(n=32), batch_size=8))
    stats = np.asarray(trainer.state.model_state["batch_stats"]["BatchNorm_0"]["mean"])
    assert (not stats.any()) == (not train_bn)  # flax starts the running mean at 0
    np.testing.assert_array_equal(np.asarray(trainer.state.params["BatchNorm_0"]["scale"]), 1.0)  # frozen
