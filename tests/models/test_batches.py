"""`CausalLMModule` trains on Hugging Face batches (`input_ids`, `attention_mask`, `labels` with
-100) as `transformers` computes their loss, and refuses any other batch at the first step naming
the keys it takes (issue 61: a `KeyError: 'tokens'` 25 frames deep)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from helpers import perturbed_transformers_model, quiet_trainer

import fitjax as fj
from fitjax import models

CONFIG = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=32)


def _hf_batch(left: bool) -> dict[str, np.ndarray]:
    """Four rows of 3 to 10 tokens padded to 10 (token 0), the first two tokens of each a prompt
    (label -100), padding labelled -100 as `DataCollatorForSeq2Seq` does."""
    rng = np.random.default_rng(0)
    ids = np.zeros((4, 10), np.int64)
    attention = np.zeros((4, 10), np.int64)
    for row, n in enumerate((10, 3, 7, 5)):
        span = slice(10 - n, 10) if left else slice(0, n)
        ids[row, span] = rng.integers(1, 64, n)
        attention[row, span] = 1
    labels = np.where(attention > 0, ids, -100)
    first = attention.argmax(1)
    labels[np.arange(4), first] = labels[np.arange(4), first + 1] = -100  # the prompt: read, not learned
    return {"input_ids": ids, "attention_mask": attention, "labels": labels}


@pytest.mark.parametrize("left", [False, True], ids=["right_padded", "left_padded"])
def test_a_hugging_face_batch_has_the_loss_transformers_gives_it(tmp_path, left):
    model = perturbed_transformers_model(transformers.LlamaConfig(**CONFIG))
    model.save_pretrained(tmp_path)
    batch = _hf_batch(left)
    torch_batch = {k: torch.from_numpy(v) for k, v in batch.items()}
    # transformers numbers a left-padded row from its first real token (as its generate does)
    positions = torch.clamp(torch_batch["attention_mask"].cumsum(1) - 1, min=0)
    with torch.no_grad():
        expected = float(model(**torch_batch, position_ids=positions).loss)  # mean over the labelled tokens

    module = models.from_pretrained(tmp_path)
    got = quiet_trainer(strategy="dp").validate(module, fj.DataLoader(batch, batch_size=4), verbose=False)
    assert got[0]["val/loss"] == pytest.approx(expected, rel=1e-5)


def test_a_hugging_face_batch_trains_and_any_other_is_refused_naming_the_keys():
    module = models.CausalLMModule({"model_type": "llama", **CONFIG})
    trainer = quiet_trainer(strategy="single", max_steps=2)
    trainer.fit(module, fj.DataLoader(_hf_batch(left=False), batch_size=4))
    assert np.isfinite(float(trainer.callback_metrics["train/loss"]))

    with pytest.raises(ValueError, match=r"CausalLMModule.loss got a dict with the keys \['ids', 'mask'\]; it "
                                         r"takes .*'input_ids' with optional 'attention_mask' and 'labels'"):
        quiet_trainer(strategy="single", max_steps=1).fit(module, fj.DataLoader({"ids": np.zeros((4, 8), np.int32),
                                                              "mask": np.ones((4, 8), np.int32)}, batch_size=4))
