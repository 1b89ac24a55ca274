"""`fj.data.TextLoader` at scale: each process tokenizes only its share of the records, once (a
cache beside the data), and every process count sees the batches one process sees, resuming
exactly across a change of the process count: explicit process indices here, and one real run
of 2 processes through `jax.distributed` on localhost."""

from __future__ import annotations

import itertools
import json
import os
import pickle
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_trees_close, word_tokenizer

import fitjax as fj
from fitjax.data import _text_cache, _tokenize

WORDS = "the cat dog sat ran on a mat log far fast slow red blue why how what is it yes no".split()
HERE = Path(__file__).resolve().parent
WORKTREE = HERE.parents[1]


def write_corpus(folder: Path, files: int = 4, records: int = 30) -> list[dict]:
    """`files` JSONL files of `records` records of 1-24 words each; returns every record in order."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)
    everything = []
    for i in range(files):
        lines = [{"text": " ".join(rng.choice(WORDS, size=int(rng.integers(1, 25))))} for _ in range(records + i)]
        (folder / f"part{i}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
        everything += lines
    return everything


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(word_tokenizer(tmp_path_factory.mktemp("tokenizer"), WORDS))


@pytest.fixture
def calls(monkeypatch):
    """Counts the records the tokenizer encodes (the real encoder runs)."""
    counted = {"records": 0}
    encode = _tokenize.Encoder.__call__

    def counting(self, record, where):
        counted["records"] += 1
        return encode(self, record, where)

    monkeypatch.setattr(_tokenize.Encoder, "__call__", counting)
    return counted


def make(folder, tokenizer, **kwargs):
    options = dict(tokenizer=tokenizer, seq_len=16, batch_size=4, shuffle=True, buffer_size=8, seed=3)
    return fj.data.TextLoader(folder, **{**options, **kwargs})


def batches(loader, stop=None):
    """The first `stop` batches of the loader's epoch (all: None), and no batch more drawn."""
    return [{k: v.copy() for k, v in batch.items()} for batch in itertools.islice(loader, stop)]


def joined(per_process):
    """The global batches from each process's rows of them."""
    return [{k: np.concatenate([b[k] for b in rows]) for k in rows[0]} for rows in zip(*per_process)]


def test_each_process_tokenizes_its_share_and_all_see_one_processs_batches(tmp_path, tokenizer, calls, monkeypatch):
    records = write_corpus(tmp_path / "data")
    expected = batches(make(tmp_path / "data", tokenizer, cache=False))
    assert calls["records"] == len(records)
    # 300-byte chunks: a file is shared out by record ranges too, not only whole files
    monkeypatch.setattr(_text_cache, "CHUNK_BYTES", 300)
    loaders = [make(tmp_path / "data", tokenizer, process_index=p, process_count=2) for p in range(2)]
    counts = []
    for loader in loaders:
        calls["records"] = 0
        assert loader.tokenize() == calls["records"]
        counts.append(calls["records"])
    shares = [loaders[0]._cache.share(p, 2) for p in range(2)]
    assert len(shares[0]) > 4 and sum(counts) == len(records) and min(counts) > len(records) / 3, counts
    calls["records"] = 0
    got = [batches(loader) for loader in loaders]
    assert calls["records"] == 0  # each reads the other's share from the cache
    assert [b["tokens"].shape[0] for b in got[0]] == [2] * len(expected)
    assert_trees_close(joined(got), expected, rtol=0, atol=0)
    # 2 -> 1: one process reads what the two tokenized
    assert_trees_close(batches(make(tmp_path / "data", tokenizer)), expected, rtol=0, atol=0)
    assert calls["records"] == 0


def test_a_position_resumes_exactly_when_the_process_count_changes(tmp_path, tokenizer):
    write_corpus(tmp_path / "data")
    for epoch in (0, 1):
        whole = make(tmp_path / "data", tokenizer)
        whole.set_epoch(epoch)
        expected = batches(whole)
        one = make(tmp_path / "data", tokenizer)
        one.set_epoch(epoch)
        first = batches(one, stop=3)
        state = json.loads(json.dumps(one.state_dict()))
        two = [make(tmp_path / "data", tokenizer, process_index=p, process_count=2) for p in range(2)]
        for loader in two:  # 1 -> 2
            loader.load_state_dict(state)
            loader.set_epoch(epoch)
        iterators = [iter(loader) for loader in two]
        middle = joined([[next(it) for _ in range(4)] for it in iterators])
        states = [loader.state_dict() for loader in two]
        assert states[0] == states[1]  # one global position
        back = make(tmp_path / "data", tokenizer)  # 2 -> 1
        back.load_state_dict(json.loads(json.dumps(states[0])))
        back.set_epoch(epoch)
        assert_trees_close(first + middle + batches(back), expected, rtol=0, atol=0)


def test_a_second_epoch_and_a_second_run_tokenize_nothing(tmp_path, tokenizer, calls):
    records = write_corpus(tmp_path / "data", files=2)
    (tmp_path / "data" / _text_cache.FOLDER).mkdir()
    theirs = tmp_path / "data" / _text_cache.FOLDER / "notes.npy"
    theirs.write_bytes(b"not fitjax's")
    loader = make(tmp_path / "data", tokenizer)
    epoch0 = batches(loader)
    assert calls["records"] == len(records)
    loader.set_epoch(1)
    batches(loader)
    assert calls["records"] == len(records)  # the second epoch reads the cache
    assert_trees_close(batches(make(tmp_path / "data", tokenizer)), epoch0, rtol=0, atol=0)
    assert calls["records"] == len(records)  # so does a second run
    stored = sorted(p.name for p in (tmp_path / "data" / _text_cache.FOLDER).iterdir())
    assert len(stored) == 3 and stored[0] == "notes.npy" and stored[1].startswith("part0.jsonl.0-")

    # a file that changed, or another tokenizer, is tokenized again; nothing is deleted
    with open(tmp_path / "data" / "part1.jsonl", "a") as file:
        file.write(json.dumps({"text": "the end"}) + "\n")
    batches(make(tmp_path / "data", tokenizer))
    assert calls["records"] == len(records) + 32
    batches(make(tmp_path / "data", tokenizer, completion_only=True))
    assert calls["records"] == 2 * len(records) + 33
    assert len(list((tmp_path / "data" / _text_cache.FOLDER).iterdir())) == 6
    assert theirs.read_bytes() == b"not fitjax's"
    assert not list((tmp_path / "data" / _text_cache.FOLDER).glob("*.tmp"))

    # an entry that is not whole is not trusted: tokenized again and rewritten
    entry = tmp_path / "data" / _text_cache.FOLDER / stored[1]
    entry.write_bytes(entry.read_bytes()[:-10])
    calls["records"] = 0
    batches(make(tmp_path / "data", tokenizer))
    assert calls["records"] == 30

    calls["records"] = 0  # one folder for every file's entries
    for _ in range(2):
        batches(make(tmp_path / "data", tokenizer, cache=tmp_path / "tokens"))
    assert calls["records"] == 30 + 32 and len(list((tmp_path / "tokens").iterdir())) == 2


def test_tokens_stay_in_memory_where_no_cache_can_be_written(tmp_path, tokenizer, calls):
    records = write_corpus(tmp_path / "data", files=2)
    expected = batches(make(tmp_path / "data", tokenizer, cache=False))
    (tmp_path / "a file").write_text("")
    for cache in (False, tmp_path / "a file" / "tokens"):  # the second cannot be created
        calls["records"] = 0
        loader = make(tmp_path / "data", tokenizer, cache=cache)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert_trees_close(batches(loader), expected, rtol=0, atol=0)
        said = [str(w.message) for w in caught if "cannot write the tokens cache" in str(w.message)]
        assert len(said) == (0 if cache is False else 1), said  # once per loader, not per chunk
        loader.set_epoch(1)
        batches(loader)
        assert calls["records"] == len(records)  # once per loader
    assert not (tmp_path / "data" / _text_cache.FOLDER).exists()
    with pytest.raises(TypeError, match=r"`TextLoader\(cache=...\)` must be True"):
        make(tmp_path / "data", tokenizer, cache=3)


def test_chunks_of_a_file_hold_each_record_once(tmp_path, tokenizer, monkeypatch):
    records = write_corpus(tmp_path / "data", files=1, records=40)
    path = str(tmp_path / "data" / "part0.jsonl")
    monkeypatch.setattr(_text_cache, "CHUNK_BYTES", 97)  # boundaries inside lines and on them
    chunks = _text_cache.list_chunks([path])
    assert len(chunks) > 10 and chunks[-1].end == os.path.getsize(path)
    read = [record for chunk in chunks for _, record in _text_cache._records(chunk)]
    assert read == records


# ------------------------------------------------------------------------ a real run of 2 processes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_tokenize_their_shares_and_see_one_processs_batches(tmp_path, tokenizer, calls):
    records = write_corpus(tmp_path / "data")
    tokenizer.save_pretrained(tmp_path / "tokenizer")
    whole = [make(tmp_path / "data", tokenizer, cache=False) for _ in range(2)]
    whole[1].set_epoch(1)
    expected = [batches(loader) for loader in whole]
    one = make(tmp_path / "data", tokenizer, cache=False)
    seen = batches(one, stop=3)
    (tmp_path / "state.json").write_text(json.dumps(one.state_dict()))
    procs, port = [], _free_port()
    for i in range(2):
        env = {**os.environ, "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}", "JAX_PROCESS_ID": str(i),
               "PYTHONPATH": os.pathsep.join([str(WORKTREE), str(HERE.parent)]), "JAX_PLATFORMS": "cpu"}
        env.pop("XLA_FLAGS", None)
        log = open(tmp_path / f"stdout_{i}.txt", "w")
        procs.append(subprocess.Popen([sys.executable, str(HERE / "text_worker.py"), str(tmp_path)], env=env,
                                      stdout=log, stderr=subprocess.STDOUT))
    try:
        for p in procs:
            p.wait(timeout=240)
    finally:
        for p in procs:  # SIGKILL: jax.distributed catches SIGTERM
            if p.poll() is None:
                p.kill()
    for i, p in enumerate(procs):
        assert p.returncode == 0, (tmp_path / f"stdout_{i}.txt").read_text()[-4000:]
    got = [pickle.loads((tmp_path / f"process_{i}.pkl").read_bytes()) for i in range(2)]
    counts = [g["tokenized"] for g in got]
    assert sum(counts) == len(records) and min(counts) > 0, counts  # each its own share
    assert [g["after_epochs"] for g in got] == counts  # the second epoch tokenized nothing
    for epoch in (0, 1):
        assert_trees_close(joined([g["epochs"][epoch] for g in got]), expected[epoch], rtol=0, atol=0)
    assert_trees_close(seen + joined([g["resumed"] for g in got]), expected[0], rtol=0, atol=0)  # 1 -> 2
    assert got[0]["state"] == got[1]["state"]
    back = make(tmp_path / "data", tokenizer)  # 2 -> 1, from the cache the two wrote
    back.load_state_dict(got[0]["state"])
    assert_trees_close(expected[0][:2] + batches(back), expected[0], rtol=0, atol=0)
    assert calls["records"] == 3 * len(records)  # the references above (cache=False); none here
