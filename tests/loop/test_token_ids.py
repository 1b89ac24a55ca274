"""Token ids are checked where they enter (issue 61): `generate` with id 1000 for a 40-token
vocabulary returned `[0, 0, 0, 0]`, id -5 generated what id 35 does, and a fit whose tokenizer has
more ids than the model trained on a `nan` loss, all without a word."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import TinyLMModule, quiet_trainer, word_tokenizer

import fitjax as fj
from fitjax import models
from fitjax.loop import _token_ids


def _llama(vocab: int) -> models.CausalLMModule:
    return models.CausalLMModule({"model_type": "llama", "vocab_size": vocab, "hidden_size": 16,
                                  "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2})


def test_generate_refuses_prompt_ids_outside_the_models_logits():
    module = TinyLMModule()  # declares no vocab_size: its logits' width (40) is the vocabulary
    trainer = quiet_trainer(strategy="single")
    with pytest.warns(UserWarning, match="never fitted nor loaded"):
        trainer.generate(module, [[1, 2]], max_new_tokens=2, temperature=0)
    with pytest.raises(ValueError, match=r"prompt 1 holds the token id 1000 at 2 \(1 out of range in all\); the "
                                         r"vocabulary has 40 ids, 0\.\.39\. Encode the prompts with the model's"):
        trainer.generate(module, [[1, 2], [3, 4, 1000]], max_new_tokens=2)
    with pytest.raises(ValueError, match=r"prompt 0 holds the token id -5 at 0"):
        trainer.generate(module, [-5, 3], max_new_tokens=2)
    assert _token_ids.vocab_size(module) is None and module.__dict__["_generation_vocab"]


def test_a_fit_refuses_a_tokenizer_with_more_ids_than_the_model(tmp_path):
    folder = word_tokenizer(tmp_path / "tokenizer", "the cat dog sat ran on a mat".split())  # 16 ids
    (tmp_path / "a.jsonl").write_text(json.dumps({"text": "the cat sat"}) + "\n")
    loader = fj.data.TextLoader(tmp_path / "a.jsonl", tokenizer=folder, seq_len=8, batch_size=8)
    with pytest.raises(ValueError, match=r"train_data's tokenizer makes ids 0\.\.15 \(16 tokens, added ones "
                                         r"included\), but CausalLMModule's model has a vocabulary of 12 \(its "
                                         r"vocab_size\).*vocab_size >= 16"):
        quiet_trainer(max_steps=1).fit(_llama(12), loader)


def test_the_first_batch_is_checked_against_the_vocabulary():
    tokens = np.ones((8, 9), np.int32)
    tokens[3, 4] = 20
    with pytest.raises(ValueError, match=r"the first train batch\['tokens'\] holds the token id 20 at \[3, 4\] "
                                         r".*the vocabulary has 16 ids, 0\.\.15\. Check the tokenizer"):
        quiet_trainer(max_steps=1).fit(_llama(16), fj.DataLoader({"tokens": tokens}, batch_size=8))
    hf = {"input_ids": np.ones((8, 9), np.int32), "labels": np.full((8, 9), -100, np.int32)}
    hf["input_ids"][0, 0] = -1
    with pytest.raises(ValueError, match=r"the first batch of the validation data\['input_ids'\] holds the token "
                                         r"id -1 at \[0, 0\]"):
        quiet_trainer().validate(_llama(16), fj.DataLoader(hf, batch_size=8), verbose=False)
    hf["input_ids"][0, 0] = 1
    hf["labels"][:, 4:] = 2  # -100 labels are Hugging Face's "no loss": they pass
    loss = quiet_trainer().validate(_llama(16), fj.DataLoader(hf, batch_size=8), verbose=False)[0]["val/loss"]
    assert np.isfinite(loss)


def test_tokenizer_size_counts_added_tokens():
    from tokenizers import Tokenizer, models as tokenizer_models

    tokenizer = Tokenizer(tokenizer_models.WordLevel({"<unk>": 0, "a": 1}, unk_token="<unk>"))
    tokenizer.add_special_tokens(["<s>"])
    assert _token_ids.tokenizer_size(tokenizer) == 3
    assert _token_ids.tokenizer_size(object()) is None
