"""`fj.data.TextLoader`: text files to token batches (packed or padded), streamed, resumable;
chat templates and prompt masking; packed rows train as the examples one by one would."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import VOCAB, TinyLM, assert_trees_close, quiet_trainer, word_tokenizer

import fitjax as fj

WORDS = "the cat dog sat ran on a mat log far fast slow red blue why how what is it yes no".split()


def _records(n, seed=0, low=1, high=20):
    rng = np.random.default_rng(seed)
    return [{"text": " ".join(rng.choice(WORDS, size=int(rng.integers(low, high))))} for _ in range(n)]


def _write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    folder = word_tokenizer(tmp_path_factory.mktemp("tokenizer"), WORDS + [".", "?", ","])
    from transformers import AutoTokenizer

    assert len(AutoTokenizer.from_pretrained(folder)) <= VOCAB  # the ids TinyLM embeds
    return folder


def _all(loader):
    return [{k: v.copy() for k, v in batch.items()} for batch in loader]


def test_rows_hold_next_token_pairs_segments_and_positions(tmp_path, tokenizer):
    data = _write_jsonl(tmp_path / "a.jsonl", [{"text": "the cat sat"}, {"text": "a dog"}, {"text": "red"}])
    loader = fj.data.TextLoader(data, tokenizer=tokenizer, seq_len=8, batch_size=2)
    tok = loader.tokenizer
    batch = next(iter(loader))
    ids = [tok(text)["input_ids"] + [tok.eos_token_id] for text in ("the cat sat", "a dog", "red")]
    assert batch["tokens"][0].tolist() == ids[0][:-1] + ids[1][:-1] + ids[2][:-1] + [tok.pad_token_id] * 2
    assert batch["targets"][0].tolist() == ids[0][1:] + ids[1][1:] + ids[2][1:] + [tok.pad_token_id] * 2
    assert batch["segment_ids"][0].tolist() == [1, 1, 1, 2, 2, 3, 0, 0]
    assert batch["positions"][0].tolist() == [0, 1, 2, 0, 1, 0, 0, 0]
    assert batch["loss_mask"][0].tolist() == [1, 1, 1, 1, 1, 1, 0, 0]
    assert (batch["segment_ids"][1] == 0).all()  # the epoch's last batch, filled with padding rows
    assert float(fj.data.packing_efficiency(batch)) == 6 / 16 == loader.packing_efficiency

    padded = next(iter(fj.data.TextLoader(data, tokenizer=tokenizer, seq_len=8, batch_size=3, pack=False)))
    assert padded["segment_ids"].tolist() == [[1] * 3 + [0] * 5, [1] * 2 + [0] * 6, [1] + [0] * 7]


def test_a_corpus_larger_than_the_buffer_streams_and_every_token_comes_once(tmp_path, tokenizer):
    records = _records(3000)
    data = _write_jsonl(tmp_path / "big.jsonl", records)
    loader = fj.data.TextLoader(data, tokenizer=tokenizer, seq_len=32, batch_size=4, shuffle=True, buffer_size=16)
    batches = iter(loader)
    next(batches)
    # the first batch came from the start of the file: the shuffle window and 4 batches' packing
    read = loader.state_dict()["iterator"]["parent"]["parent"]["offset"]
    assert read < data.stat().st_size / 20
    learned = sum(float(b["loss_mask"].sum()) for b in batches) + 0.0
    first = next(iter(fj.data.TextLoader(data, tokenizer=tokenizer, seq_len=32, batch_size=4, shuffle=True,
                                         buffer_size=16)))
    expected = sum(len(r["text"].split()) for r in records)  # words + EOS, less the first token
    assert learned + float(first["loss_mask"].sum()) == expected
    assert loader.packing_efficiency > 0.9


def test_stopped_mid_epoch_a_resumed_loader_gives_the_same_batches(tmp_path, tokenizer):
    data = [_write_jsonl(tmp_path / f"{i}.jsonl", _records(12, seed=i, high=30)) for i in range(3)]
    tokenizer = fj.data.TextLoader(data[0], tokenizer=tokenizer, seq_len=8, batch_size=1).tokenizer  # loaded once

    def make():
        return fj.data.TextLoader(tmp_path, tokenizer=tokenizer, seq_len=16, batch_size=3, shuffle=True,
                                  buffer_size=8, seed=5)

    assert len(make().files) == len(data)
    for epoch in (0, 1):
        whole = make()
        whole.set_epoch(epoch)
        expected = _all(whole)
        # at every batch (inside and at the end of windows) in epoch 0, in the middle in epoch 1
        for stop in range(len(expected) + 1) if epoch == 0 else [len(expected) // 2]:
            stopped = make()
            stopped.set_epoch(epoch)
            batches = iter(stopped)
            seen = [next(batches) for _ in range(stop)]
            state = json.loads(json.dumps(stopped.state_dict()))
            resumed = make()
            resumed.load_state_dict(state)
            resumed.set_epoch(epoch)
            assert_trees_close(seen + _all(resumed), expected, rtol=0, atol=0)
    assert not all(np.array_equal(a["tokens"], b["tokens"]) for a, b in zip(expected, _all(make())))


def test_parquet_and_text_files_read_like_jsonl(tmp_path, tokenizer):
    import pyarrow as pa
    import pyarrow.parquet as pq

    records = _records(40, seed=2)
    jsonl = _write_jsonl(tmp_path / "a.jsonl", records)
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "a.parquet", row_group_size=7)
    (tmp_path / "a.txt").write_text("".join(r["text"] + "\n\n" for r in records))  # blank lines skipped
    expected = _all(fj.data.TextLoader(jsonl, tokenizer=tokenizer, seq_len=16, batch_size=2))
    for name in ("a.parquet", "a.txt"):
        def make(name=name):
            return fj.data.TextLoader(tmp_path / name, tokenizer=tokenizer, seq_len=16, batch_size=2)

        assert_trees_close(_all(make()), expected, rtol=0, atol=0)
        stopped = make()
        batches = iter(stopped)
        seen = [next(batches) for _ in range(3)]
        resumed = make()
        resumed.load_state_dict(stopped.state_dict())
        assert_trees_close(seen + _all(resumed), expected, rtol=0, atol=0)


def test_chat_records_go_through_the_template_and_only_assistant_turns_are_learned(tmp_path, tokenizer):
    chat = {"messages": [{"role": "system", "content": "be fast"}, {"role": "user", "content": "why is it red ?"},
                         {"role": "assistant", "content": "the cat ran"}, {"role": "user", "content": "how ?"},
                         {"role": "assistant", "content": "fast"}]}
    data = _write_jsonl(tmp_path / "chat.jsonl", [chat, {"prompt": "is it blue ?", "completion": "no , red"}])
    batch = next(iter(fj.data.TextLoader(data, tokenizer=tokenizer, seq_len=64, batch_size=1, completion_only=True)))
    tok = fj.data.TextLoader(data, tokenizer=tokenizer, seq_len=8, batch_size=1).tokenizer
    rendered = tok.apply_chat_template(chat["messages"], tokenize=False)
    ids = tok(rendered, add_special_tokens=False)["input_ids"]
    assert ids[0] == tok.bos_token_id and tok.convert_ids_to_tokens(ids[1]) == "<|system|>"
    words = tok.convert_ids_to_tokens(batch["targets"][0][batch["loss_mask"][0] > 0].tolist())
    # each assistant turn's content and its end marker, then the completion and EOS; nothing else
    assert words == ["the", "cat", "ran", "<|end|>", "fast", "<|end|>", "no", ",", "red", "</s>"]
    everything = next(iter(fj.data.TextLoader(data, tokenizer=tokenizer, seq_len=64, batch_size=1,
                                              completion_only=False)))
    assert everything["loss_mask"].sum() == (everything["segment_ids"] > 0).sum()
    # the default, TRL's: a prompt is read, not learned (completion_only_loss=None); a chat is
    # learned whole (assistant_only_loss=False)
    default = next(iter(fj.data.TextLoader(data, tokenizer=tokenizer, seq_len=64, batch_size=1)))
    learned = default["loss_mask"][0] > 0
    chat_end = int((default["segment_ids"][0] == 1).sum())
    assert learned[:chat_end].all()
    assert tok.convert_ids_to_tokens(default["targets"][0][chat_end:][learned[chat_end:]].tolist()) == \
        ["no", ",", "red", "</s>"]
    with pytest.raises(ValueError, match=r"TextLoader\(completion_only=...\)` must be None .* received 'yes'"):
        fj.data.TextLoader(data, tokenizer=tokenizer, seq_len=8, batch_size=1, completion_only="yes")


def test_records_the_loader_cannot_read_are_named(tmp_path, tokenizer):
    bad = _write_jsonl(tmp_path / "bad.jsonl", [{"title": "x"}])
    with pytest.raises(ValueError, match=r"bad.jsonl' \(record at 0\) has the fields \['title'\]; a record needs"):
        next(iter(fj.data.TextLoader(bad, tokenizer=tokenizer, seq_len=8, batch_size=1)))
    (tmp_path / "x.csv").write_text("a\n")
    with pytest.raises(ValueError, match=r"suffix '.csv' is not a text format"):
        fj.data.TextLoader(tmp_path / "x.csv", tokenizer=tokenizer, seq_len=8, batch_size=1)
    with pytest.raises(FileNotFoundError, match=r"`files` entry '.*nowhere' names no file"):
        fj.data.TextLoader(tmp_path / "nowhere", tokenizer=tokenizer, seq_len=8, batch_size=1)
    from tokenizers import Tokenizer

    chat = _write_jsonl(tmp_path / "chat.jsonl", [{"messages": [{"role": "user", "content": "why"}]}])
    plain = Tokenizer.from_file(str(tokenizer / "tokenizer.json"))
    with pytest.raises(ValueError, match=r"is a chat \('messages'\), but the tokenizer has no chat template"):
        next(iter(fj.data.TextLoader(chat, tokenizer=plain, seq_len=8, batch_size=1)))


# ----------------------------------------------------------------------------- packing and the loss


def _token_loss(model, params, batch, packed=True):
    logits = model.apply(params, batch["tokens"], positions=batch["positions"] if packed else None,
                         segment_ids=batch["segment_ids"] if packed else None)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"])
    return fj.TokenLoss(sum=(ce * batch["loss_mask"]).sum(), count=batch["loss_mask"].sum())


def _one_by_one(loader_args, model, params):
    """Σ loss, Σ tokens and the gradient of Σ loss over the examples, each alone in a row of its
    own with padding after it: plain causal attention, no segments, so nothing but the causal
    mask separates a token from the padding (which comes after every real token)."""
    rows = next(iter(fj.data.TextLoader(**loader_args, batch_size=64, pack=False)))
    assert rows["segment_ids"][-1].sum() == 0  # every example is in this one batch
    total, grads = jax.jit(jax.value_and_grad(lambda p: _token_loss(model, p, rows, packed=False).sum))(params)
    return total, rows["loss_mask"].sum(), grads


def _models(vocab):
    """A model of one's own over fj.nn.attention, the GPT example's, and a Llama of fitjax.models."""
    import gpt

    from fitjax import models

    llama = {"model_type": "llama", "vocab_size": vocab, "hidden_size": 32, "intermediate_size": 64,
             "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2}
    return {"own": TinyLM(layers=1), "gpt example": gpt.gpt_model(layers=1, width=32, heads=2, context=32),
            "llama": models.from_config(llama)}


@pytest.mark.parametrize("which", ["own", "gpt example", "llama"])
def test_a_packed_batch_has_the_loss_and_gradients_of_its_examples_one_by_one(tmp_path, tokenizer, which):
    data = _write_jsonl(tmp_path / "a.jsonl", _records(12, seed=3, high=12))
    args = dict(files=data, tokenizer=tokenizer, seq_len=32)
    packed = _all(fj.data.TextLoader(**args, batch_size=4))
    model = _models(len(fj.data.TextLoader(**args, batch_size=1).tokenizer))[which]
    params = model.init(jax.random.key(0), packed[0]["tokens"])
    assert sum(int(b["segment_ids"].max(initial=0)) for b in packed) > len(packed) * 2  # several per row

    rows = {key: np.concatenate([b[key] for b in packed]) for key in packed[0]}  # every packed row at once
    total, grads = jax.jit(jax.value_and_grad(lambda p: _token_loss(model, p, rows).sum))(params)
    count = sum(b["loss_mask"].sum() for b in packed)
    alone_total, alone_count, alone_grads = _one_by_one(args, model, params)
    assert count == alone_count
    # float32, summed in another order: agreement to 1e-5 relative
    np.testing.assert_allclose(total / count, alone_total / alone_count, rtol=1e-5)
    assert_trees_close(grads, alone_grads, rtol=1e-5, atol=1e-6)


def test_no_attention_weight_crosses_a_segment_boundary(tmp_path, tokenizer):
    data = _write_jsonl(tmp_path / "a.jsonl", _records(12, seed=4, high=10))
    batch = next(iter(fj.data.TextLoader(data, tokenizer=tokenizer, seq_len=16, batch_size=2)))
    segments = jnp.asarray(batch["segment_ids"])
    q, k = jax.random.normal(jax.random.key(1), (2, 2, 16, 2, 16))
    # values one-hot in the key position: the output is the attention weights themselves
    v = jnp.broadcast_to(jnp.eye(16)[None, :, None, :], (2, 16, 2, 16))
    weights = fj.nn.attention(q, k, v, segment_ids=segments, implementation="xla")  # [b, q, h, k]
    same = (segments[:, :, None] == segments[:, None, :])[:, :, None, :]
    assert np.asarray(jnp.where(same, 0.0, weights)).max() == 0.0
    assert (segments.max(axis=1) >= 2).all()  # there are boundaries to cross
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-6)


def test_prompt_masked_loss_is_the_loss_over_completion_tokens_only(tmp_path, tokenizer):
    pairs = [{"prompt": "why is the cat red ?", "completion": "it ran far"},
             {"prompt": "how ?", "completion": "fast , on a log"}, {"prompt": "a dog ?", "completion": "yes"}]
    data = _write_jsonl(tmp_path / "pairs.jsonl", pairs)
    loader = fj.data.TextLoader(data, tokenizer=tokenizer, seq_len=32, batch_size=2, completion_only=True)
    tok = loader.tokenizer
    model = TinyLM(layers=1)
    batches = _all(loader)
    params = model.init(jax.random.key(0), batches[0]["tokens"])
    masked = sum(_token_loss(model, params, b).sum for b in batches) / sum(b["loss_mask"].sum() for b in batches)
    assert sum(b["loss_mask"].sum() for b in batches) == (3 + 1) + (5 + 1) + (1 + 1)  # completions and EOS

    losses = []  # by hand: each pair alone, the cross-entropy of the completion's tokens and EOS
    examples = [(tok(p["prompt"])["input_ids"], tok(p["completion"], add_special_tokens=False)["input_ids"])
                for p in pairs]
    ids = [prompt + completion + [tok.eos_token_id] for prompt, completion in examples]
    rows = np.zeros((len(ids), max(map(len, ids))), np.int32)  # padding after each: causal, unseen
    for row, example in zip(rows, ids):
        row[: len(example)] = example
    log_p = jax.nn.log_softmax(model.apply(params, jnp.asarray(rows)))
    for n, ((prompt, _), example) in enumerate(zip(examples, ids)):
        losses += [-log_p[n, t - 1, example[t]] for t in range(len(prompt), len(example))]
    np.testing.assert_allclose(masked, np.mean(losses), rtol=1e-5)


class LM(fj.LitModule):
    def __init__(self):
        super().__init__()
        self.model = TinyLM(layers=1)

    def loss(self, model, batch):
        logits = model(batch["tokens"], positions=batch["positions"], segment_ids=batch["segment_ids"])
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"])
        return fj.TokenLoss(sum=(ce * batch["loss_mask"]).sum(), count=batch["loss_mask"].sum())

    def metrics(self, batch, outputs):
        return {"packing_efficiency": fj.data.packing_efficiency(batch)}

    def configure_optimizer(self):
        return optax.adam(1e-2)


class Batches(fj.Callback):
    def __init__(self):
        self.tokens = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.tokens.append(np.asarray(batch["tokens"]).copy())


def test_a_fit_stopped_mid_epoch_resumes_with_the_same_token_batches(tmp_path, tokenizer):
    data = _write_jsonl(tmp_path / "a.jsonl", _records(80, seed=6, high=30))

    def fit(max_steps, ckpt_path=None):
        loader = fj.data.TextLoader(data, tokenizer=tokenizer, seq_len=16, batch_size=4, shuffle=True, buffer_size=8)
        seen = Batches()
        trainer = quiet_trainer(max_steps=max_steps, strategy="single", callbacks=[seen], log_every_n_steps=1)
        trainer.fit(LM(), loader, ckpt_path=ckpt_path)
        return trainer, seen.tokens

    whole, expected = fit(6)
    assert 0.5 < whole.callback_metrics["train/packing_efficiency"] <= 1.0
    stopped, first = fit(3)
    stopped.save_checkpoint(tmp_path / "mid")
    _, rest = fit(6, ckpt_path=tmp_path / "mid")
    assert len(first) == 3 and len(rest) == 3
    np.testing.assert_array_equal(np.stack(first + rest), np.stack(expected))
