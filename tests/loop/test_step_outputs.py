"""What `training_step`, `validation_step` and `test_step` return reaches the batch-end hooks'
`outputs` with the batch's real rows, Lightning 2.x's `self.validation_step_outputs.append(...)`
collects a value per batch, and outputs nobody reads cost no transfer to the host.

Lightning 2.6 on the same shapes (10 examples in batches of 4, a `training_step` returning
`{"loss": loss, "preds": preds}`, a `validation_step` appending `preds` and returning them):
`on_train_batch_end` gets `{"loss": (), "preds": (4,)}`, `on_validation_batch_end` gets the
dict with `preds` of (4,), (4,), (2,) rows, and the appended list holds those three arrays.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import sklearn.metrics
from helpers import quiet_trainer

import fitjax as fj
from fitjax import metrics as fm

_rng = np.random.default_rng(3)
X = _rng.normal(size=(44, 6)).astype(np.float32)
Y = np.where(_rng.random(44) < 0.7, 0, _rng.integers(1, 4, 44))  # imbalanced: mostly class 0


def _data(n, batch_size):
    return fj.DataLoader({"x": X[:n], "y": Y[:n]}, batch_size=batch_size)


class Classifier(fj.LitModule):
    """Lightning-style: the train and validation steps return their predictions, the test step
    returns them as an array."""

    def __init__(self):
        super().__init__()
        self.model = nn.Dense(4)

    def training_step(self, batch, batch_idx):
        logits = self.model(batch["x"])
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()
        return {"loss": loss, "preds": logits.argmax(-1)}

    def validation_step(self, batch, batch_idx):
        return {"preds": self.model(batch["x"]).argmax(-1)}

    def test_step(self, batch, batch_idx):
        return self.model(batch["x"]).argmax(-1)

    def configure_optimizers(self):
        return optax.sgd(0.3)


class Appending(Classifier):
    """Lightning 2.x's way: the validation step appends its predictions (and the targets) to
    lists the epoch's end reads; the metric the same step logs is the number to match."""

    def __init__(self):
        super().__init__()
        self.val_f1 = fm.F1Score(task="multiclass", num_classes=4, average="macro")
        self.validation_step_outputs, self.validation_targets = [], []
        self.epoch_f1, self.appended_rows, self.train_outputs = [], [], []

    def validation_step(self, batch, batch_idx):
        preds = self.model(batch["x"]).argmax(-1)
        self.validation_step_outputs.append(preds)
        self.validation_targets.append(batch["y"])
        self.val_f1(preds, batch["y"])
        self.log("val_f1", self.val_f1)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.train_outputs.append((jax.tree.map(np.shape, outputs), np.shape(batch[0]["x"])))

    def on_validation_epoch_end(self):
        preds, target = np.concatenate(self.validation_step_outputs), np.concatenate(self.validation_targets)
        self.appended_rows.append([len(p) for p in self.validation_step_outputs])
        self.epoch_f1.append(sklearn.metrics.f1_score(target, preds, average="macro"))
        self.validation_step_outputs.clear()
        self.validation_targets.clear()


class SeenInTest(fj.Callback):
    def __init__(self):
        self.seen = []

    def on_test_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.seen.append((np.asarray(outputs), np.asarray(batch["x"])))


def test_each_validation_appends_its_real_rows_and_sklearn_f1_equals_the_metric():
    """dp over 8 devices, 20 validation examples in batches of 8 (the last, 4 real rows, padded):
    the lists get each batch's real rows; sklearn's macro F1 of them equals the F1Score the
    module logs (merged on the device) at every epoch; a test step returning an array gives the
    hook that array's real rows, as Lightning."""
    module, tested = Appending(), SeenInTest()
    logged = []
    note = fj.LambdaCallback(on_validation_end=lambda trainer, module: logged.append(
        None if trainer.sanity_checking else float(trainer.callback_metrics["val_f1"])))
    trainer = quiet_trainer(strategy="dp", max_epochs=1, num_sanity_val_steps=1, accumulate_grad_batches=2,
                            callbacks=[tested, note])
    trainer.fit(module, _data(40, 8), _data(20, 8))
    assert module.appended_rows == [[8], [8, 8, 4]]  # the sanity check's batch, then the epoch's
    assert logged[0] is None and 0.0 < logged[1] < 1.0
    np.testing.assert_allclose(module.epoch_f1[1], logged[1], rtol=1e-6)
    # train: once per optimizer step, each micro-batch's rows stacked as the hook's batch is; the
    # epoch's last step has one micro-batch (5 batches of 8: steps of 2, 2 and 1)
    assert module.train_outputs == [({"loss": (), "preds": (2, 8)}, (2, 8, 6))] * 2 + [
        ({"loss": (), "preds": (1, 8)}, (2, 8, 6))]

    trainer.test(module, _data(20, 8))
    params = module.variables[0]
    for preds, x in tested.seen:
        np.testing.assert_array_equal(preds, np.asarray(module.model.apply({"params": params}, x)).argmax(-1))
    assert [len(p) for p, _ in tested.seen] == [8, 8, 4]


def test_appending_in_training_step_fails_at_once_showing_the_fitjax_way():
    class Appends(Appending):
        def training_step(self, batch, batch_idx):
            out = super().training_step(batch, batch_idx)
            self.validation_step_outputs.append(out["preds"])
            return out

    module = Appends()
    with pytest.raises(TypeError, match=r"training_step appended a traced value to `self.validation_step_outputs`"
                                        r".*only in `validation_step` / `test_step`.*on_train_batch_end"):
        quiet_trainer(strategy="single", max_epochs=1).fit(module, _data(16, 8))
    assert module.validation_step_outputs == []  # no tracer left behind


class Ignores(fj.Callback):
    """Batch-end hooks that never read `outputs`."""

    def __init__(self):
        self.calls = 0

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.calls += 1

    def on_validation_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.calls += 1


def test_outputs_nobody_reads_stay_on_the_device(monkeypatch):
    """With hooks that take `outputs` but never read them, the steps return the predictions and
    nothing reaches the host per step: no implicit transfer (guarded), and the explicit ones
    (the log window, the validation's accumulators, the epoch's means) do not grow with the
    number of batches."""
    transfers = []
    device_get = jax.device_get
    monkeypatch.setattr(jax, "device_get", lambda tree: transfers.append(1) or device_get(tree))
    counts = []
    for n in (16, 40):
        ignores, before = Ignores(), len(transfers)
        trainer = quiet_trainer(strategy="single", max_epochs=1, num_sanity_val_steps=0, log_every_n_steps=100,
                                callbacks=[ignores])
        with jax.transfer_guard_device_to_host("disallow"):
            trainer.fit(Classifier(), _data(n, 8), _data(n, 8))
        assert ignores.calls == 2 * n // 8
        counts.append(len(transfers) - before)
    assert counts[0] == counts[1] > 0


def test_a_metric_updated_in_loss_and_returned_as_its_declaration_logs_its_updates():
    """`self.f1.update(...)` inside `loss`, then `metrics` returning `{"f1": self.f1}` (the bare
    declaration): the same numbers as returning the update itself, in training (where `loss` is
    differentiated, with accumulation) and validation."""

    class Updated(fj.LitModule):
        def __init__(self, declared: bool):
            super().__init__()
            self.model = nn.Dense(4)
            self.declared = declared
            self.f1 = fm.F1Score(task="multiclass", num_classes=4, average="macro")

        def loss(self, model, batch):
            logits = model(batch["x"])
            if self.declared:
                self.f1.update(logits, batch["y"])
            return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean(), logits

        def metrics(self, batch, logits):
            return {"f1": self.f1 if self.declared else self.f1.update(logits, batch["y"])}

        def configure_optimizer(self):
            return optax.sgd(0.3)

    results = []
    for declared in (True, False):
        trainer = quiet_trainer(strategy="single", max_epochs=1, num_sanity_val_steps=0, accumulate_grad_batches=2)
        trainer.fit(Updated(declared), _data(32, 8), _data(20, 8))
        results.append({k: float(v) for k, v in trainer.callback_metrics.items()})
    assert set(results[0]) >= {"train/f1_epoch", "val/f1"}
    assert results[0] == results[1]
    assert 0.0 < results[0]["val/f1"] < 1.0
