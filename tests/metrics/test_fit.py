"""Metric classes through real fits: the values logged equal torchmetrics' on the same
predictions, on one device, dp on 8 devices (a last partial batch padded) and fsdp; Lightning
style and fitjax's `metrics` log the same numbers; checkpoints follow a metric."""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import numpy as np
import optax
import pytest

import fitjax as fj
from fitjax import metrics as fm

C = 4
_rng = np.random.default_rng(0)
X = _rng.normal(size=(203, 6)).astype(np.float32)  # 203 = 6 batches of 32 + 11
Y = _rng.integers(0, C, 203)
Y[Y == 3] = 2  # class 3 is never a target
IGNORED = np.where(_rng.random(203) < 0.2, -1, Y)  # the same targets, a fifth of them ignored
DATA = [{"x": X[i:i + 32], "y": Y[i:i + 32], "z": IGNORED[i:i + 32]} for i in range(0, 203, 32)]
TRAIN = DATA[:-1]  # the train batches divide over 8 devices; the validation's last one is padded

MC = dict(task="multiclass", num_classes=C)
DECLARED = {  # name -> (metric, what it reads: "logits" or "probs", the targets)
    "acc": (fm.Accuracy(**MC, average="macro", top_k=2), "logits", "y"),
    "f1": (fm.F1Score(**MC, average="macro"), "logits", "y"),
    "f1_ignored": (fm.F1Score(**MC, average="weighted", ignore_index=-1), "logits", "z"),
    "f1_none": (fm.F1Score(**MC, average="none"), "logits", "y"),
    "auroc": (fm.AUROC(**MC, thresholds=200), "probs", "y"),
    "ap": (fm.AveragePrecision(**MC, thresholds=200, average="weighted"), "probs", "y"),
}


class Native(fj.LitModule):
    """fitjax's way: `metrics` returns updated metrics."""

    def __init__(self, lr: float = 0.0):
        super().__init__()
        self.lr = lr
        self.model = nn.Dense(C)

    def loss(self, model, batch):
        logits = model(batch["x"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean(), logits

    def metrics(self, batch, logits):
        inputs = {"logits": logits, "probs": jax.nn.softmax(logits)}
        return {name: metric.update(inputs[what], batch[target]) for name, (metric, what, target) in DECLARED.items()}

    def configure_optimizer(self):
        return optax.sgd(self.lr)


def _trainer(tmp_path, **kwargs):
    return fj.Trainer(default_root_dir=tmp_path, enable_progress_bar=False, enable_model_summary=False,
                      logger=False, **kwargs)


@functools.cache
def _reference(params_key: bytes, rows: int) -> dict[str, np.ndarray]:
    return _torchmetrics(_REFERENCE_PARAMS[params_key], rows)


_REFERENCE_PARAMS: dict = {}


def _expected(module, rows: int = len(X)) -> dict[str, np.ndarray]:
    """torchmetrics on the module's predictions (computed once per weights: the fits of the
    strategies start from the same weights and do not move them)."""
    params = jax.device_get(module.variables[0])
    key = b"".join(np.asarray(leaf).tobytes() for leaf in jax.tree.leaves(params))
    _REFERENCE_PARAMS[key] = params
    return _reference(key, rows)


def _torchmetrics(params, rows: int) -> dict[str, np.ndarray]:
    import torch
    import torchmetrics

    logits = torch.tensor(np.asarray(nn.Dense(C).apply({"params": params}, X[:rows])))
    inputs = {"logits": logits, "probs": logits.softmax(-1)}
    out = {}
    for name, (metric, what, target) in DECLARED.items():
        kwargs = {k: v for k, v in metric._arguments() if k in ("average", "top_k", "ignore_index", "thresholds")}
        ref = getattr(torchmetrics, type(metric).__name__)(**MC, **kwargs)
        out[name] = ref(inputs[what], torch.tensor({"y": Y, "z": IGNORED}[target][:rows])).numpy()
    return out


@pytest.mark.parametrize("strategy", ["single", "dp", "fsdp"])
def test_logged_metrics_equal_torchmetrics_on_every_strategy(tmp_path, strategy):
    module = Native()
    trainer = _trainer(tmp_path, max_epochs=1, strategy=strategy, enable_checkpointing=False)
    trainer.fit(module, TRAIN, DATA)
    logged = trainer.callback_metrics
    for key, expected in [*((f"val/{n}", v) for n, v in _expected(module).items()),
                          *((f"train/{n}_epoch", v) for n, v in _expected(module, 192).items())]:
        got = [logged[f"{key}/{i}"] for i in range(C)] if expected.ndim else logged[key]  # every example once
        np.testing.assert_allclose(got, expected, atol=1e-6, err_msg=f"{strategy} {key}")
    assert logged["val/f1_none/3"] == 0.0  # a class never a target and never predicted: 0, not NaN


class Lightning(fj.LitModule):
    """Lightning's way: metrics made in `__init__`, updated and logged in the hooks."""

    def __init__(self, lr: float = 0.0):
        super().__init__()
        self.lr = lr
        self.model = nn.Dense(C)
        self.train_f1 = fm.F1Score(**MC, average="macro")
        self.val_metrics = fm.MetricCollection({"f1": fm.F1Score(**MC, average="macro"),
                                                "auroc": fm.AUROC(**MC)}, prefix="val_")

    def training_step(self, batch, batch_idx):
        logits = self.model(batch["x"])
        self.train_f1(logits, batch["y"])
        self.log("train_f1", self.train_f1, on_step=False, on_epoch=True)
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()

    def validation_step(self, batch, batch_idx):
        logits = self.model(batch["x"])
        self.val_metrics.update(jax.nn.softmax(logits), batch["y"])
        self.log_dict(self.val_metrics, prog_bar=True)

    def configure_optimizers(self):
        return optax.sgd(self.lr)


def test_lightning_style_logs_what_native_style_logs(tmp_path):
    native, lightning = Native(lr=0.5), Lightning(lr=0.5)
    fits = []
    for module in (native, lightning):
        trainer = _trainer(tmp_path, max_epochs=2, enable_checkpointing=False, seed=3)
        trainer.fit(module, TRAIN, DATA)
        fits.append(trainer.callback_metrics)
    n, lt = fits
    assert lt["val_f1"] == n["val/f1"] and lt["val_auroc"] == n["val/auroc"]
    assert lt["train_f1"] == n["train/f1_epoch"]
    assert "val_f1" in trainer.progress_bar_metrics


def test_model_checkpoint_keeps_the_epoch_with_the_best_f1(tmp_path):
    """Each epoch's F1 by hand from the weights of that epoch; the checkpoint kept is the best's."""
    import torch
    import torchmetrics

    by_epoch = []

    class Record(fj.Callback):
        def on_validation_end(self, trainer, module):
            if trainer.sanity_checking:
                return
            by_epoch.append((trainer.current_epoch, trainer.callback_metrics["val/f1"]))

    ckpt = fj.ModelCheckpoint(monitor="val/f1", mode="max", save_top_k=1)
    module = Native(lr=2.0)
    trainer = _trainer(tmp_path, max_epochs=4, callbacks=[ckpt, Record()], seed=1)
    trainer.fit(module, TRAIN, DATA)
    best_epoch, best = max(by_epoch, key=lambda e: e[1])
    assert ckpt.best_model_score == pytest.approx(best)
    assert f"epoch={best_epoch}" in ckpt.best_model_path
    # the F1 logged for the kept checkpoint is the F1 of its weights, computed by torchmetrics
    restored = Native.load_from_checkpoint(ckpt.best_model_path)
    logits = np.asarray(restored.model.apply({"params": restored.variables[0]}, X))
    ref = torchmetrics.F1Score(**MC, average="macro")(torch.tensor(logits), torch.tensor(Y)).item()
    assert best == pytest.approx(ref, abs=1e-6)


def test_resume_mid_epoch_logs_the_epoch_metrics_of_the_uninterrupted_run(tmp_path):
    """The train epoch's metric states (read up to the checkpoint) are saved with it and merged
    with the rest of the epoch after the resume: the epoch's numbers are the same, bitwise."""
    def fit(root, **kwargs):
        ckpt_path = kwargs.pop("ckpt_path", None)
        trainer = _trainer(root, max_epochs=2, log_every_n_steps=2, num_sanity_val_steps=0, **kwargs)
        trainer.fit(Native(lr=0.5), TRAIN, ckpt_path=ckpt_path)
        return {k: v for k, v in trainer.callback_metrics.items() if k.endswith("_epoch") or "_epoch/" in k}

    saving = fj.ModelCheckpoint(tmp_path / "ckpt", every_n_train_steps=9, save_top_k=-1)
    full = fit(tmp_path / "full", callbacks=[saving])
    mid_epoch = tmp_path / "ckpt" / "epoch=1-step=9"  # 3 of epoch 1's 6 steps done
    assert mid_epoch.exists()
    resumed = fit(tmp_path / "resumed", ckpt_path=mid_epoch)
    assert "train/f1_none_epoch/0" in full and resumed == full
