"""Text data files with faults are named, file, line and key, never trained on quietly: a byte
that is not UTF-8, a text field that is `null` or a number, and a file edited between a save and
its resume (issue 61, "Why" 9)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from helpers import word_tokenizer

import fitjax as fj

WORDS = "the cat dog sat ran on a mat log far fast slow red blue".split()


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return word_tokenizer(tmp_path_factory.mktemp("tokenizer"), WORDS)


def _lines(n, seed=0):
    rng = np.random.default_rng(seed)
    return [json.dumps({"text": " ".join(rng.choice(WORDS, size=int(rng.integers(3, 12))))}) + "\n" for _ in range(n)]


def _first_batch(path, tokenizer):
    return next(iter(fj.data.TextLoader(path, tokenizer=tokenizer, seq_len=16, batch_size=2)))


def test_a_byte_that_is_not_utf8_names_the_file_the_line_and_the_byte_offset(tmp_path, tokenizer):
    lines = _lines(3)
    data = tmp_path / "latin1.jsonl"
    bad = '{"text": "caf\xe9 the cat"}\n'.encode("latin1")  # written by a Latin-1 editor
    data.write_bytes(lines[0].encode() + lines[1].encode() + bad)
    at = len(lines[0]) + len(lines[1]) + bad.index(b"\xe9")
    with pytest.raises(ValueError, match=rf"latin1.jsonl', line 3: the byte b'\\xe9' at byte offset {at} is not UTF-8"):
        _first_batch(data, tokenizer)


@pytest.mark.parametrize("record, key, shown", [
    ({"text": None}, "text", "None (NoneType)"),
    ({"text": 12345}, "text", "12345 (int)"),
    ({"prompt": "the cat", "completion": None}, "completion", "None (NoneType)"),
])
def test_a_text_field_that_is_not_a_string_names_the_file_the_line_and_the_key(tmp_path, tokenizer, record, key,
                                                                                 shown):
    data = tmp_path / "a.jsonl"
    first = _lines(1)[0]
    data.write_text(first + json.dumps(record) + "\n")
    with pytest.raises(ValueError, match=rf"a.jsonl', line 2 \(byte {len(first)}\): '{key}' is {re.escape(shown)}, not a string"):
        _first_batch(data, tokenizer)


def test_a_null_text_in_a_parquet_file_names_its_row(tmp_path, tokenizer):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([{"text": "the cat"}, {"text": None}]), tmp_path / "a.parquet")
    with pytest.raises(ValueError, match=r"a.parquet', row 1: 'text' is None \(NoneType\), not a string"):
        _first_batch(tmp_path / "a.parquet", tokenizer)


def _loader(data, tokenizer, pack: bool):
    return fj.data.TextLoader(data, tokenizer=tokenizer, seq_len=16, batch_size=2, pack=pack)


@pytest.mark.parametrize("edit, pack, says", [
    (lambda lines: ['{"text": "a new first line"}\n', *lines], True, r"it holds \d+ bytes, \d+ then"),
    (lambda lines: lines[:3], True, r"it holds \d+ bytes, \d+ then"),
    (lambda lines: [*lines, *lines[:2]], True, r"it holds \d+ bytes, \d+ then"),  # appended to
    # the same bytes in another order: the size holds, the record at the position does not
    (lambda lines: lines[::-1], False, r"the record there is not the one read then \(byte \d+, line \d+: its tokens differ"),
], ids=["a line inserted", "cut", "appended to", "reordered"])
def test_a_file_edited_between_save_and_resume_is_refused(tmp_path, tokenizer, edit, pack, says):
    lines = _lines(40)
    data = tmp_path / "a.jsonl"
    data.write_text("".join(lines))
    loader = _loader(data, tokenizer, pack)
    batches = iter(loader)
    for _ in range(3):
        next(batches)
    state = loader.state_dict()
    resumed = _loader(data, tokenizer, pack)
    resumed.load_state_dict(state)
    next(iter(resumed))  # as it was: resumes

    data.write_text("".join(edit(lines)))  # between the save and the resume
    resumed = _loader(data, tokenizer, pack)
    resumed.load_state_dict(state)
    with pytest.raises(ValueError, match=rf"a.jsonl' changed since the data position was saved \(at byte \d+\): {says}"):
        next(iter(resumed))
