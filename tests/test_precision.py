"""Trainer(precision=...): bf16 mixed training, float16 dynamic loss scaling, dtypes, errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import flax.linen as nn
import numpy as np
import orbax.checkpoint as ocp
import pytest
from helpers import FixedLinearFit, Poisoned, assert_trees_close, fixed_linear_data, poisoned_data, quiet_trainer

import fitjax as fj
from digits import DigitsClassifier, digits_splits


def test_bf16_mixed_trains_digits_past_accuracy_bar(tmp_path):
    train, val = digits_splits()
    loader = fj.DataLoader(train, batch_size=64, shuffle=True, drop_last=True)
    module = DigitsClassifier(lr=3e-3, total_steps=8 * len(loader))
    trainer = quiet_trainer(max_epochs=8, strategy="single", precision="bf16-mixed")
    trainer.fit(module, loader, fj.DataLoader(val, batch_size=128))
    assert trainer.callback_metrics["val/acc"] >= 0.95
    # float32 master weights and optimizer state; the Linen model's outputs come back as float32
    assert {x.dtype for x in jax.tree.leaves(trainer.state.params)} == {jnp.dtype(jnp.float32)}
    assert {x.dtype for x in jax.tree.leaves(trainer.state.opt_state) if x.ndim} == {jnp.dtype(jnp.float32)}
    logits = trainer.predict(module, fj.DataLoader({"image": val["image"][:8]}, batch_size=8))
    assert logits.dtype == np.int32  # argmax of float32 logits; the step ran in bf16 all the same


class _Layer(nn.Module):
    @nn.compact
    def __call__(self, h, _):
        return jnp.tanh(nn.Dense(3)(h)).astype(h.dtype), None


class _Scanned(nn.Module):
    """Three Dense layers as one `nn.scan` (the usual way to compile a deep stack once)."""

    @nn.compact
    def __call__(self, x):
        h, _ = nn.scan(_Layer, variable_axes={"params": 0}, split_rngs={"params": True}, length=3)(
            name="layers")(x.astype(jnp.bfloat16), None)
        return nn.Dense(1)(h)


class _ScannedLayers(FixedLinearFit):
    def __init__(self):
        super().__init__()
        self.model = _Scanned()


def test_bf16_mixed_keeps_a_scanned_layers_carry_in_bfloat16():
    # only the model's outermost call returns float32: a layer inside nn.scan keeps its carry's dtype
    trainer = quiet_trainer(max_steps=2, strategy="single", precision="bf16-mixed")
    trainer.fit(_ScannedLayers(), fj.DataLoader(fixed_linear_data(), batch_size=8))
    assert trainer.global_step == 2 and np.isfinite(float(trainer.callback_metrics["train/loss"]))
    assert trainer.state.params["layers"]["Dense_0"]["kernel"].shape == (3, 3, 3)


def test_bf16_true_keeps_parameters_and_optimizer_state_in_bfloat16():
    trainer = quiet_trainer(max_steps=3, strategy="single", precision="bf16-true")
    module = Poisoned(optimizer="adam")
    trainer.fit(module, fj.DataLoader(poisoned_data(), batch_size=16))
    floats = [x for x in jax.tree.leaves((trainer.state.params, trainer.state.opt_state)) if x.ndim]
    assert floats and {x.dtype for x in floats} == {jnp.dtype(jnp.bfloat16)}


class _Record(fj.Callback):
    def __init__(self):
        self.params, self.scales, self.losses = [], [], []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.params.append(jax.device_get(trainer.state.params))
        self.scales.append(float(trainer.state.loss_scale.scale))
        self.losses.append(float(outputs["loss"]))


def test_16_mixed_skips_the_step_with_inf_gradients_and_recovers():
    poison_at = 5
    record = _Record()
    trainer = quiet_trainer(max_steps=12, strategy="single", log_every_n_steps=1, callbacks=[record],
                            precision=fj.Precision("16-mixed", init_scale=2.0**8, growth_interval=3))
    trainer.fit(Poisoned(), fj.DataLoader(poisoned_data(loss_poison_at=poison_at), batch_size=16))

    # steps 0..4 finite: the scale doubles after every 3 finite steps
    assert record.scales[:5] == [256.0, 256.0, 512.0, 512.0, 512.0]
    # the poisoned step: parameters unchanged, scale halved, counter reset
    assert not np.isfinite(record.losses[poison_at])
    assert_trees_close(record.params[poison_at], record.params[poison_at - 1], rtol=0, atol=0)
    assert record.scales[poison_at] == 256.0
    # and training carries on: parameters move again, the scale grows again
    assert not np.allclose(jax.tree.leaves(record.params[poison_at + 1])[0],
                           jax.tree.leaves(record.params[poison_at])[0])
    assert record.scales[poison_at + 3] == 512.0
    assert np.all(np.isfinite(record.losses[poison_at + 1:]))
    assert trainer.callback_metrics["skipped_steps"] == 1.0
    assert trainer.callback_metrics["loss_scale"] == record.scales[-1]


def test_loss_scale_is_part_of_the_checkpointed_state(tmp_path):
    trainer = quiet_trainer(max_steps=4, strategy="single", precision=fj.Precision("16-mixed", init_scale=16.0, growth_interval=2))
    trainer.fit(Poisoned(), fj.DataLoader(poisoned_data(), batch_size=16))
    assert float(trainer.state.loss_scale.scale) == 64.0
    with ocp.StandardCheckpointer() as ckpt:
        ckpt.save(tmp_path / "state", trainer.state)
        ckpt.wait_until_finished()
        restored = ckpt.restore(tmp_path / "state", jax.tree.map(ocp.utils.to_shape_dtype_struct, trainer.state))
    assert isinstance(restored.loss_scale, fj.precision.LossScale)
    assert_trees_close(restored.loss_scale, trainer.state.loss_scale, rtol=0, atol=0)


def test_unknown_precision_lists_the_allowed_ones():
    with pytest.raises(ValueError, match=r"'8-true'.*'32-true', 'bf16-mixed', '16-mixed', 'bf16-true', "
                                         r"'16-true', '64-true'"):
        fj.Trainer(precision="8-true")
    with pytest.raises(ValueError, match="growth_interval"):
        fj.Precision("16-mixed", growth_interval=0)
    assert fj.Precision("bf16").name == "bf16-mixed"  # Lightning's short aliases
    assert fj.Precision(64).name == fj.Precision("64").name == "64-true"


# "64-true" and "16-true" against Lightning 2.6 (torch CPU, /work/lvenv): a 3->1 Linear with weights
# [[0.125, -0.25, 0.375]] and bias 0.0625 (exact in float32, so both start from the same numbers),
# x = sin(arange(48).reshape(16, 3) * 0.7), y = cos(arange(16) * 0.3)[:, None] as float64 tensors,
# MSE, SGD(lr=0.1, momentum=0.9), batch 4 unshuffled, max_epochs=3, `L.Trainer(precision=p)`;
# the weights and bias after fit (`.double()` for 16-true):
LIGHTNING_TRUE = {
    "64-true": ([0.28483292243545316, -0.24136583057239475, 0.2283746316253325], -0.23574742820757735),
    "16-true": ([0.28466796875, -0.24169921875, 0.2283935546875], -0.2357177734375),
}


def _fit_true(precision, *, strategy="single", batch_size=4, **kwargs):
    trainer = quiet_trainer(max_epochs=3, strategy=strategy, precision=precision, **kwargs)
    module = FixedLinearFit()
    trainer.fit(module, fj.DataLoader(fixed_linear_data(), batch_size=batch_size))
    return trainer, module


def _weights(trainer):
    dense = jax.device_get(trainer.state.params["Dense_0"])
    return np.asarray(dense["kernel"], np.float64).ravel(), float(dense["bias"][0])


def test_64_true_computes_in_float64_and_matches_lightning_to_float64_precision(capsys):
    trainer, module = _fit_true("64-true")
    assert "precision 64-true (x64 enabled)" in capsys.readouterr().out  # the fit banner
    assert {x.dtype for x in jax.tree.leaves((trainer.state.params, trainer.state.opt_state)) if x.ndim} == {
        jnp.dtype(jnp.float64)}
    kernel, bias = _weights(trainer)
    np.testing.assert_allclose(kernel, LIGHTNING_TRUE["64-true"][0], rtol=1e-14)
    np.testing.assert_allclose(bias, LIGHTNING_TRUE["64-true"][1], rtol=1e-14)
    # "32-true" is 1e-7 away from the same numbers: the float64 above is real
    kernel32, _ = _weights(_fit_true("32-true")[0])
    assert np.abs(kernel32 - LIGHTNING_TRUE["64-true"][0]).max() > 1e-9
    # x64 was on for the run only; predict turns it on again and returns float64
    assert not jax.config.jax_enable_x64 and jnp.ones(1).dtype == jnp.float32
    out = trainer.predict(module, fj.DataLoader({"x": fixed_linear_data()["x"]}, batch_size=4))
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, fixed_linear_data()["x"] @ kernel[:, None] + bias, rtol=1e-13)
    assert not jax.config.jax_enable_x64


def test_16_true_keeps_float16_and_matches_lightning_to_float16_precision():
    trainer, _ = _fit_true("16-true")
    assert {x.dtype for x in jax.tree.leaves((trainer.state.params, trainer.state.opt_state)) if x.ndim} == {
        jnp.dtype(jnp.float16)}
    assert trainer.state.loss_scale is None  # "16-true" has no loss scaling, as Lightning's
    kernel, bias = _weights(trainer)
    # float16's spacing near 0.25 is 2.4e-4; the two run the same float16 operations in other orders
    np.testing.assert_allclose(kernel, LIGHTNING_TRUE["16-true"][0], atol=1e-3)
    np.testing.assert_allclose(bias, LIGHTNING_TRUE["16-true"][1], atol=1e-3)


@pytest.mark.parametrize("strategy", ["dp", "fsdp"])
def test_64_true_under_dp_and_fsdp_equals_one_device(strategy):
    strategy_obj = fj.strategies.FSDP(min_size_to_shard=1) if strategy == "fsdp" else strategy
    single, _ = _fit_true("64-true", batch_size=8)
    sharded, _ = _fit_true("64-true", strategy=strategy_obj, batch_size=8, accumulate_grad_batches=2)
    plain, _ = _fit_true("64-true", batch_size=8, accumulate_grad_batches=2)
    assert_trees_close(sharded.state.params, plain.state.params, rtol=1e-13, atol=1e-15)
    assert {x.dtype for x in jax.tree.leaves(sharded.state.params)} == {jnp.dtype(jnp.float64)}
    assert not np.allclose(_weights(single)[0], _weights(plain)[0], rtol=1e-6)  # accumulation changed it


def test_64_true_resumes_bitwise(tmp_path):
    full, _ = _fit_true("64-true")
    cut = quiet_trainer(max_steps=5, precision="64-true", strategy="single", enable_checkpointing=True,
                        callbacks=[fj.ModelCheckpoint(tmp_path, save_last=True)])
    cut.fit(FixedLinearFit(), fj.DataLoader(fixed_linear_data(), batch_size=4))
    resumed = quiet_trainer(max_epochs=3, precision="64-true", strategy="single", enable_checkpointing=True,
                            callbacks=[fj.ModelCheckpoint(tmp_path, save_last=True)])
    resumed.fit(FixedLinearFit(), fj.DataLoader(fixed_linear_data(), batch_size=4), ckpt_path="last")
    assert_trees_close((resumed.state.params, resumed.state.opt_state), (full.state.params, full.state.opt_state),
                       rtol=0, atol=0)
    assert {x.dtype for x in jax.tree.leaves(resumed.state.params)} == {jnp.dtype(jnp.float64)}
