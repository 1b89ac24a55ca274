"""`fj.data.TextLoader` over a store: JSONL and Parquet files in a bucket (moto's S3 server, and
the GCS emulator) give the batches the same files on disk give, and resume mid-file; their tokens
are cached in the bucket."""

from __future__ import annotations

import json

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from helpers import assert_trees_close, word_tokenizer

import fitjax as fj

WORDS = "the cat dog sat ran on a mat log far fast".split()


def test_a_corpus_in_a_bucket_reads_and_resumes_like_one_on_disk(tmp_path, store_bucket):
    rng = np.random.default_rng(0)
    records = [{"text": " ".join(rng.choice(WORDS, size=int(rng.integers(1, 30))))} for _ in range(60)]
    local = tmp_path / "corpus"
    local.mkdir()
    (local / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records[:30]))
    pq.write_table(pa.Table.from_pylist(records[30:]), local / "b.parquet", row_group_size=8)
    fs = fsspec.filesystem(store_bucket.split("://")[0])
    fs.put(str(local / "a.jsonl"), f"{store_bucket}/corpus/a.jsonl")
    fs.put(str(local / "b.parquet"), f"{store_bucket}/corpus/b.parquet")
    tokenizer = word_tokenizer(tmp_path / "tokenizer", WORDS)

    def make(files):
        return fj.data.TextLoader(files, tokenizer=tokenizer, seq_len=16, batch_size=2, shuffle=True, buffer_size=4)

    expected = list(make(local))
    remote = make(f"{store_bucket}/corpus/")
    assert remote.files == [f"{store_bucket}/corpus/a.jsonl", f"{store_bucket}/corpus/b.parquet"]
    batches = iter(remote)
    seen = [next(batches) for _ in range(len(expected) // 2)]
    resumed = make(f"{store_bucket}/corpus")
    resumed.load_state_dict(json.loads(json.dumps(remote.state_dict())))
    assert_trees_close(seen + list(resumed), expected, rtol=0, atol=0)
    # the tokens are stored beside the data, in the bucket: one entry per chunk (the Parquet
    # file's 4 row groups and the JSONL file), read back by the next loader, which tokenizes nothing
    fs.invalidate_cache()
    assert len(fs.ls(f"{store_bucket}/corpus/.fitjax_tokens")) == 5
    assert make(f"{store_bucket}/corpus").tokenize() == 0
