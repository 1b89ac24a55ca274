"""Google's JAX metrics (google-metrax, clu) returned from `metrics` as they are, through real
fits: the logged epoch value is the same metric computed by hand on the whole validation set's
predictions (or sklearn's), on one device and on dp over 8 devices with a padded last batch."""

from __future__ import annotations

import clu.metrics
import flax.linen as nn
import jax
import jax.numpy as jnp
import metrax
import numpy as np
import optax
import pytest
import sklearn.metrics
from helpers import regression_data

import fitjax as fj

_DATA = regression_data(n=203)  # 203 = 6 batches of 32 + 11: the validation's last batch is padded
X, Y = _DATA["x"], _DATA["y"][:, 0]
POSITIVE = (Y > 0).astype(np.int32)
VAL = [{"x": X[i:i + 32], "y": Y[i:i + 32], "pos": POSITIVE[i:i + 32]} for i in range(0, 203, 32)]
TRAIN = VAL[:-1]  # the train batches divide over 8 devices


def google_metrics(x, pred, y, pos):
    """name -> metrax / clu metric of one batch: `pred` a regression of `y`, `sigmoid(pred)` the
    probability that `y > 0` (`pos`); for ranking, each row's 8 features scored by `x * pred` and
    relevant where `x > 0.5`."""
    prob = jax.nn.sigmoid(pred)
    scores, relevant, ks = x * pred[:, None], (x > 0.5).astype(jnp.float32), jnp.array([1, 3])
    return {
        "aucroc": metrax.AUCROC.from_model_output(prob, pos),
        "aucpr": metrax.AUCPR.from_model_output(prob, pos),
        "precision": metrax.Precision.from_model_output(prob, pos),
        "recall": metrax.Recall.from_model_output(prob, pos),
        "mse": metrax.MSE.from_model_output(pred, y),
        "r2": metrax.RSQUARED.from_model_output(pred, y),
        "ndcg": metrax.NDCGAtK.from_model_output(scores, relevant, ks),  # one value per k
        "mrr": metrax.MRR.from_model_output(scores, relevant, ks),
        "clu_accuracy": clu.metrics.Accuracy.from_model_output(
            logits=jnp.stack([-pred, pred], -1), labels=pos.astype(jnp.int32)),
        "clu_mae": clu.metrics.Average.from_model_output(jnp.abs(pred - y)),
    }


class Google(fj.LitModule):
    def __init__(self):
        super().__init__()
        self.model = nn.Dense(1)

    def loss(self, model, batch):
        pred = model(batch["x"])[:, 0]
        return ((pred - batch["y"]) ** 2).mean(), pred

    def metrics(self, batch, pred):
        return google_metrics(batch["x"], pred, batch["y"], batch["pos"])

    def configure_optimizer(self):
        return optax.sgd(0.05)


@pytest.mark.parametrize("strategy", ["single", "dp"])
def test_metrax_and_clu_metrics_log_their_value_on_the_whole_validation_set(tmp_path, strategy):
    module = Google()
    trainer = fj.Trainer(default_root_dir=tmp_path, max_epochs=1, strategy=strategy, logger=False,
                         enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
    trainer.fit(module, TRAIN, VAL)
    logged = trainer.callback_metrics

    pred = np.asarray(nn.Dense(1).apply({"params": module.variables[0]}, X))[:, 0]
    by_hand = {name: np.asarray(m.compute()) for name, m in google_metrics(X, jnp.asarray(pred), Y, POSITIVE).items()}
    for name, value in by_hand.items():  # every validation example once, the padding rows none
        got = [logged[f"val/{name}/{i}"] for i in range(value.size)] if value.ndim else logged[f"val/{name}"]
        np.testing.assert_allclose(got, value, rtol=1e-5, atol=1e-6, err_msg=name)
    # and independent of metrax: sklearn on the same predictions
    decided = pred > 0
    assert logged["val/precision"] == pytest.approx(sklearn.metrics.precision_score(POSITIVE, decided), abs=1e-6)
    assert logged["val/recall"] == pytest.approx(sklearn.metrics.recall_score(POSITIVE, decided), abs=1e-6)
    assert logged["val/clu_accuracy"] == pytest.approx(sklearn.metrics.accuracy_score(POSITIVE, decided), abs=1e-6)
    assert logged["val/mse"] == pytest.approx(sklearn.metrics.mean_squared_error(Y, pred), rel=1e-5)
    assert logged["val/r2"] == pytest.approx(sklearn.metrics.r2_score(Y, pred), abs=1e-5)
    assert logged["val/aucroc"] == pytest.approx(sklearn.metrics.roc_auc_score(POSITIVE, pred), abs=1e-2)
    assert "train/aucroc_epoch" in logged


class LoggedGoogle(fj.LitModule):
    """Lightning's way: `self.log` a metrax / clu metric in `validation_step`."""

    def __init__(self):
        super().__init__()
        self.model = nn.Dense(1)

    def training_step(self, batch, batch_idx):
        return ((self.model(batch["x"])[:, 0] - batch["y"]) ** 2).mean()

    def validation_step(self, batch, batch_idx):
        pred = self.model(batch["x"])[:, 0]
        self.log("val_aucroc", metrax.AUCROC.from_model_output(jax.nn.sigmoid(pred), batch["pos"]))
        self.log("val_mae", clu.metrics.Average.from_model_output(jnp.abs(pred - batch["y"])))

    def configure_optimizers(self):
        return optax.sgd(0.05)


def test_metrax_and_clu_metrics_passed_to_self_log_log_the_epoch_value(tmp_path):
    module = LoggedGoogle()
    trainer = fj.Trainer(default_root_dir=tmp_path, max_epochs=1, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False)
    trainer.fit(module, TRAIN, VAL)
    pred = jnp.asarray(nn.Dense(1).apply({"params": module.variables[0]}, X))[:, 0]
    expected_auc = float(metrax.AUCROC.from_model_output(jax.nn.sigmoid(pred), POSITIVE).compute())
    assert trainer.callback_metrics["val_aucroc"] == pytest.approx(expected_auc, abs=1e-6)
    assert trainer.callback_metrics["val_mae"] == pytest.approx(float(jnp.abs(pred - Y).mean()), rel=1e-5)


@pytest.mark.parametrize("name", ["BLEU", "RougeL", "WER"])
def test_metrax_text_metrics_in_the_step_fail_at_once_naming_the_metric_and_the_host(tmp_path, name):
    """metrax's text metrics split strings in Python: they cannot run in the jitted step."""
    class Text(Google):
        def metrics(self, batch, pred):
            tokens, refs = (pred > 0).astype(jnp.int32), batch["pos"]
            return {"text": getattr(metrax, name).from_model_output(tokens, refs[:, None] if name == "BLEU" else refs)}

    trainer = fj.Trainer(default_root_dir=tmp_path, max_epochs=1, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False)
    with pytest.raises(TypeError, match=rf"Text.metrics calls metrax.{name}.from_model_output, which takes "
                                        r"Python strings.*Compute it on the host"):
        trainer.fit(Text(), TRAIN, VAL)
