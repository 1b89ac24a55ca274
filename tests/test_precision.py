"""Trainer(precision=...): bf16 mixed training, float16 dynamic loss scaling, dtypes, errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from helpers import Poisoned, assert_trees_close, poisoned_data, quiet_trainer

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
    with pytest.raises(ValueError, match=r"'64-true'.*'32-true', 'bf16-mixed', '16-mixed', 'bf16-true'"):
        fj.Trainer(precision="64-true")
    with pytest.raises(ValueError, match="growth_interval"):
        fj.Precision("16-mixed", growth_interval=0)
    assert fj.Precision("bf16").name == "bf16-mixed"  # Lightning's short aliases
