"""A jit rule broken in `loss` or `metrics` (the main API) gets the same tailored message as in
Lightning's hooks (tests/module/test_lightning.py): the rule, the fix, JAX's error as the cause."""

from __future__ import annotations

import jax
import pytest
from helpers import Regressor, quiet_trainer, regression_data

import fitjax as fj


class FloatInMetrics(Regressor):
    def metrics(self, batch, outputs):
        return {"mae_host": float(abs(outputs["pred"] - batch["y"]).mean())}


class IfInLoss(Regressor):
    def loss(self, model, batch):
        loss = super().loss(model, batch)
        loss = loss[0] if isinstance(loss, tuple) else loss
        return loss * 2 if loss > 1 else loss


@pytest.mark.parametrize("module, method, cause, says", [
    (FloatInMetrics, "metrics", jax.errors.ConcretizationTypeError, r"float\(x\).*self\.log"),
    # host work per step is sent to the host hooks
    (IfInLoss, "loss", jax.errors.TracerBoolConversionError, r"Python `if`.*jnp\.where.*`on_train_batch_start"),
])
def test_loss_and_metrics_break_a_jit_rule_with_the_rule_and_the_fix(module, method, cause, says):
    trainer = quiet_trainer(max_steps=1, strategy="single")
    with pytest.raises(TypeError, match=rf"{module.__name__}\.{method} is traced under jax\.jit.*" + says) as info:
        trainer.fit(module(), fj.DataLoader(regression_data(n=32), batch_size=32))
    assert isinstance(info.value.__cause__, cause)
    assert trainer.global_step == 0  # raised while tracing, before any step ran


class IfInPredict(Regressor):
    def predict_step(self, model, batch):
        pred = model(batch["x"], train=False)
        return pred * 2 if pred.mean() > 0 else pred


def test_predict_step_breaking_a_jit_rule_gets_the_rule_and_the_fix():
    """`predict_step` goes through the same forward call as `loss`, with the same help."""
    with pytest.raises(TypeError, match=r"IfInPredict\.predict_step is traced under jax\.jit.*Python `if`.*"
                                        r"jnp\.where") as info:
        quiet_trainer(strategy="single").predict(IfInPredict(), fj.DataLoader(regression_data(n=32), batch_size=32))
    assert isinstance(info.value.__cause__, jax.errors.TracerBoolConversionError)
