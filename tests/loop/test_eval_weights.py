"""Evaluation reduces like training: a `TokenLoss` over every token of the evaluation, a scalar
loss over its real rows; padding rows weigh nothing, so `val/loss` is the same whatever the
batch size, packing or device count (issue 61: it was 5.15, 3.97 and 1.98 for one data set)."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import quiet_trainer, word_tokenizer

import fitjax as fj
from fitjax import models

WORDS = "the cat dog sat ran on a mat log far fast slow red blue".split()
DOCUMENTS = ["the cat sat on a mat", "a dog ran", "red blue fast slow far log the cat dog"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("eval_weights")
    tokenizer = word_tokenizer(folder / "tokenizer", WORDS)
    path = folder / "val.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in DOCUMENTS))
    return path, tokenizer


def _module(tokenizer):
    from transformers import AutoTokenizer

    size = len(AutoTokenizer.from_pretrained(tokenizer))
    return models.CausalLMModule({"model_type": "llama", "vocab_size": size, "hidden_size": 16,
                                  "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                                  "max_position_embeddings": 32})


def _token_mean(module, loader):
    """Σ cross-entropy / Σ tokens, each document run alone through the bare model."""
    params = {"params": module.variables[0]}
    tok = loader.tokenizer
    total = count = 0.0
    for text in DOCUMENTS:
        ids = np.asarray(tok(text)["input_ids"] + [tok.eos_token_id], np.int32)[None]
        logits = module.model.apply(params, jnp.asarray(ids[:, :-1]))
        total += float(optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), ids[:, 1:]).sum())
        count += ids.shape[1] - 1
    return total / count


@pytest.mark.parametrize("strategy", ["single", "dp"])
def test_val_loss_is_the_token_mean_whatever_the_batch_packing_or_devices(data, strategy):
    path, tokenizer = data
    module = _module(tokenizer)
    trainer = quiet_trainer(strategy=strategy)
    losses = {}
    for pack, batch_size in ((True, 2), (False, 4), (False, 8)):
        loader = fj.data.TextLoader(path, tokenizer=tokenizer, seq_len=16, batch_size=batch_size, pack=pack)
        losses[pack, batch_size] = trainer.validate(module, loader, verbose=False)[0]["val/loss"]
    expected = _token_mean(module, loader)
    # before: each row's own mean, and the filler rows of the last batch as 0 (5.15, 3.97, 1.98)
    for got in losses.values():
        assert got == pytest.approx(expected, rel=1e-5)


class RowLoss(fj.LitModule):
    """A scalar loss: each row's mean squared error over its marked tokens."""

    def __init__(self):
        super().__init__()
        import flax.linen as nn

        self.model = nn.Embed(64, 1)

    def loss(self, model, batch):
        per_token = (model(batch["tokens"])[..., 0] - 1.0) ** 2
        mask = batch["loss_mask"]
        return ((per_token * mask).sum(-1) / jnp.maximum(mask.sum(-1), 1)).mean()

    def configure_optimizer(self):
        return optax.sgd(0.1)


def test_a_scalar_loss_weighs_real_rows_and_no_padding_row(data):
    path, tokenizer = data
    module = RowLoss()
    trainer = quiet_trainer(strategy="dp")
    got = {}
    for batch_size in (1, 8):  # 8: three documents and five rows of padding
        loader = fj.data.TextLoader(path, tokenizer=tokenizer, seq_len=16, batch_size=batch_size, pack=False)
        got[batch_size] = trainer.validate(module, loader, verbose=False)[0]["val/loss"]
    # Lightning's rule: each batch's loss weighted by its rows; here every row is its own batch
    assert got[8] == pytest.approx(got[1], rel=1e-6)
    table = np.asarray(jax.device_get(module.variables[0]["embedding"]))[:, 0]
    rows = [row for batch in fj.data.TextLoader(path, tokenizer=tokenizer, seq_len=16, batch_size=1, pack=False)
            for row in zip(batch["tokens"], batch["loss_mask"])]
    expected = np.mean([((table[t] - 1.0) ** 2 * m).sum() / m.sum() for t, m in rows])
    assert got[8] == pytest.approx(float(expected), rel=1e-5)


def test_real_rows_reads_the_batch_padding_marks():
    from fitjax.step.token_loss import real_rows

    assert real_rows({"segment_ids": np.array([[1, 2, 0], [0, 0, 0]])}).tolist() == [1.0, 0.0]
    assert real_rows({"input_ids": np.ones((2, 3)), "attention_mask": np.array([[0, 0, 0], [1, 0, 0]])}
                     ).tolist() == [0.0, 1.0]
    assert real_rows({"x": np.zeros((3, 2))}).tolist() == [1.0, 1.0, 1.0]
