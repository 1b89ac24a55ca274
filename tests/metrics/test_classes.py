"""Each metric class against torchmetrics on the same predictions, states merged from two halves
(as two batches, devices or processes would be): equal to 1e-6."""

from __future__ import annotations

import numpy as np
import pytest

import fitjax.metrics as fm

N, C = 97, 5
_rng = np.random.default_rng(0)
LOGITS = _rng.normal(size=(N, C)).astype(np.float32)
PROBS = np.exp(LOGITS) / np.exp(LOGITS).sum(1, keepdims=True)
TARGET = _rng.integers(0, C, N)
TARGET[TARGET == 4] = 3  # class 4 is never a target (and rarely predicted)
BINARY = (PROBS[:, 0], (TARGET == 0).astype(np.int64))
MULTICLASS = (PROBS, TARGET)
MULTILABEL = (1 / (1 + np.exp(-LOGITS)), (_rng.random((N, C)) > 0.6).astype(np.int64))

MC = dict(task="multiclass", num_classes=C)
CASES = [
    ("Accuracy", dict(MC, average="micro"), MULTICLASS),
    ("Accuracy", dict(MC, average="macro", top_k=2), MULTICLASS),
    ("Accuracy", dict(task="multilabel", num_labels=C, average="macro"), MULTILABEL),
    ("Precision", dict(MC, average="macro", ignore_index=2), MULTICLASS),
    ("Precision", dict(task="binary"), BINARY),
    ("Recall", dict(MC, average="weighted"), MULTICLASS),
    ("Recall", dict(task="multilabel", num_labels=C, average="micro"), MULTILABEL),
    ("F1Score", dict(MC, average="macro"), MULTICLASS),
    ("F1Score", dict(MC, average="none"), MULTICLASS),
    ("F1Score", dict(MC, average="macro", top_k=2), MULTICLASS),
    ("FBetaScore", dict(MC, beta=2.0, average="weighted", ignore_index=0), MULTICLASS),
    ("ConfusionMatrix", dict(MC, normalize="true", ignore_index=1), MULTICLASS),
    ("ConfusionMatrix", dict(task="multilabel", num_labels=C), MULTILABEL),
    ("AUROC", dict(MC, average="macro", thresholds=200), MULTICLASS),
    ("AUROC", dict(MC, average="none", thresholds=200), MULTICLASS),
    ("AUROC", dict(task="binary", thresholds=200), BINARY),
    ("AveragePrecision", dict(MC, average="weighted", thresholds=200), MULTICLASS),
    ("AveragePrecision", dict(task="multilabel", num_labels=C, thresholds=200), MULTILABEL),
]


def _torchmetrics(name, kwargs, *args):
    import torch
    import torchmetrics

    metric = getattr(torchmetrics, name)(**kwargs)
    metric.update(*(torch.tensor(np.asarray(a)) for a in args))
    return metric.compute().numpy()


@pytest.mark.parametrize("name, kwargs, data", CASES, ids=lambda x: x if isinstance(x, str) else "")
def test_classification_equals_torchmetrics(name, kwargs, data):
    preds, target = data
    metric = getattr(fm, name)(**kwargs)
    half = N // 2
    ours = metric.update(preds[:half], target[:half]).merge(metric.update(preds[half:], target[half:])).compute()
    ref = _torchmetrics(name, kwargs, preds, target)
    assert np.asarray(ours).shape == ref.shape
    np.testing.assert_allclose(np.asarray(ours), ref, atol=1e-6)
    assert not np.isnan(np.asarray(ours, np.float64)).any()  # class 4 never a target: no NaN


def test_binned_auroc_is_within_its_bound_of_the_exact_one():
    """The exact AUROC (torchmetrics' default) and the binned one differ only through pairs whose
    scores share a bin: at most their fraction (the bound the docs state)."""
    scores, labels = BINARY
    binned = float(fm.AUROC(task="binary", thresholds=200).update(scores, labels).compute())
    exact = float(_torchmetrics("AUROC", dict(task="binary"), scores, labels))
    bins = np.minimum((scores * 199).astype(int), 198)
    pos, neg = bins[labels == 1], bins[labels == 0]
    shared = sum(int((neg == b).sum()) for b in pos) / (len(pos) * len(neg))
    assert abs(binned - exact) <= shared + 1e-6


@pytest.mark.parametrize("name, kwargs, args", [
    ("MeanSquaredError", {}, "reg"), ("MeanSquaredError", dict(squared=False), "reg"),
    ("MeanAbsoluteError", {}, "reg"), ("R2Score", {}, "reg"), ("R2Score", dict(multioutput="raw_values"), "reg2"),
    ("MeanMetric", {}, "one"), ("SumMetric", {}, "one"), ("MaxMetric", {}, "one"), ("MinMetric", {}, "one"),
])
def test_regression_and_aggregation_equal_torchmetrics(name, kwargs, args):
    y = _rng.normal(size=(N, 3)).astype(np.float32)
    pred = y + 0.5 * _rng.normal(size=(N, 3)).astype(np.float32)
    args = {"reg": (pred[:, 0], y[:, 0]), "reg2": (pred, y), "one": (y[:, 0],)}[args]
    metric = getattr(fm, name)(**kwargs)
    ours = metric.update(*(a[:40] for a in args)).merge(metric.update(*(a[40:] for a in args))).compute()
    np.testing.assert_allclose(np.asarray(ours), _torchmetrics(name, kwargs, *args), rtol=1e-5, atol=1e-6)


def test_perplexity_equals_torchmetrics_with_ignore_index():
    import torch
    from torchmetrics.text import Perplexity

    logits = _rng.normal(size=(4, 7, 11)).astype(np.float32)
    target = _rng.integers(0, 11, (4, 7))
    target[0, :3] = -100
    ours = fm.Perplexity(ignore_index=-100).update(logits, target).compute()
    ref = Perplexity(ignore_index=-100)(torch.tensor(logits), torch.tensor(target))
    np.testing.assert_allclose(float(ours), float(ref), rtol=1e-6)


def test_metric_collection_prefixes_and_merges():
    coll = fm.MetricCollection({"acc": fm.Accuracy(**MC), "f1": fm.F1Score(**MC, average="macro")}, prefix="val_")
    a, b = coll.update(PROBS[:50], TARGET[:50]), coll.update(PROBS[50:], TARGET[50:])
    values = a.merge(b).compute()
    assert sorted(values) == ["val_acc", "val_f1"]
    np.testing.assert_allclose(float(values["val_f1"]), _torchmetrics("F1Score", dict(MC, average="macro"),
                                                                        PROBS, TARGET), atol=1e-6)
    assert sorted(coll.clone(prefix="test_")) == ["test_acc", "test_f1"]


def test_bad_arguments_name_the_argument_and_the_value():
    with pytest.raises(ValueError, match=r"F1Score\(task=...\) must be one of .* got 'multi'"):
        fm.F1Score(task="multi")
    with pytest.raises(ValueError, match=r"num_classes, an int >= 2; got None"):
        fm.Accuracy(task="multiclass")
    with pytest.raises(ValueError, match=r"average=...\) must be one of .* got 'samples'"):
        fm.Precision(task="multiclass", num_classes=3, average="samples")
    with pytest.raises(ValueError, match=r"thresholds=...\) must be an int >= 2 .* got \[0.5\]"):
        fm.AUROC(task="binary", thresholds=[0.5])
