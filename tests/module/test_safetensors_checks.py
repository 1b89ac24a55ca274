"""A broken `model.safetensors` is named, file and tensor, before any array is read: a git-lfs
pointer, an empty or cut download, a header that overruns the file, offsets outside the data,
tensors sharing bytes, a shape whose bytes are not its span (issue 61, "Why" 5)."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from fitjax.models import from_pretrained
from fitjax.module._weight_sources import save_safetensors

CONFIG = {"model_type": "llama", "vocab_size": 16, "hidden_size": 8, "intermediate_size": 16,
          "num_hidden_layers": 1, "num_attention_heads": 2}


def _folder(tmp_path, data: bytes):
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    (tmp_path / "model.safetensors").write_bytes(data)
    return tmp_path


def _crafted(header: dict, data: bytes) -> bytes:
    encoded = json.dumps(header).encode()
    return struct.pack("<Q", len(encoded)) + encoded + data


def _refused(tmp_path, data: bytes, *patterns: str) -> str:
    folder = _folder(tmp_path, data)
    with pytest.raises(ValueError) as error:
        from_pretrained(folder)
    message = str(error.value)
    assert str(folder / "model.safetensors") in message, message
    for pattern in patterns:
        assert pattern in message, message
    return message


def test_a_git_lfs_pointer_is_named_as_one(tmp_path):
    pointer = (b"version https://git-lfs.github.com/spec/v1\n"
               b"oid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\nsize 2471645608\n")
    _refused(tmp_path, pointer, "git-lfs pointer", "git lfs pull")


def test_an_empty_file_is_named(tmp_path):
    _refused(tmp_path, b"", "is empty (0 bytes)")


def test_a_cut_download_is_named_with_its_tensor(tmp_path):
    save_safetensors({"a": np.ones((4, 4), np.float32), "b": np.ones((32, 32), np.float32)}, tmp_path / "whole")
    whole = (tmp_path / "whole").read_bytes()
    _refused(tmp_path, whole[:-100], "tensor 'b'", "cut")


def test_a_header_longer_than_the_file_is_refused(tmp_path):
    _refused(tmp_path, struct.pack("<Q", 2**60) + b"{}", f"header of {2**60} bytes")


def test_offsets_outside_the_data_are_refused(tmp_path):
    _refused(tmp_path, _crafted({"w": {"dtype": "F32", "shape": [4], "data_offsets": [16, 32]}}, b"\0" * 16),
             "tensor 'w'", "bytes 16..32")


def test_overlapping_tensors_are_refused(tmp_path):
    header = {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
              "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}}
    _refused(tmp_path, _crafted(header, b"\0" * 24), "'a' and 'b' overlap")


def test_a_shape_whose_bytes_differ_from_its_span_is_refused(tmp_path):
    header = {"w": {"dtype": "F32", "shape": [32, 32], "data_offsets": [0, 40]}}
    _refused(tmp_path, _crafted(header, b"\0" * 40), "tensor 'w'", "needs 4096 bytes", "span 40")


def test_an_unknown_dtype_and_a_malformed_entry_are_named(tmp_path):
    _refused(tmp_path, _crafted({"w": {"dtype": "F4", "shape": [2], "data_offsets": [0, 1]}}, b"\0"),
             "'w'", "'F4'")
    _refused(tmp_path, _crafted({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, b"\0" * 4),
             "'w'", "shape=[-1]")


def test_a_header_that_is_not_json_is_named(tmp_path):
    _refused(tmp_path, struct.pack("<Q", 4) + b"\xff{{{" + b"\0" * 8, "not JSON")


def test_a_sharded_index_naming_a_missing_file_or_one_outside_its_folder_is_named(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"w": "model-00001-of-00002.safetensors"}}))
    with pytest.raises(ValueError, match=r"lists the file 'model-00001-of-00002.safetensors', which is not"):
        from_pretrained(tmp_path)
    save_safetensors({"w": np.ones(2, np.float32)}, tmp_path.parent / "elsewhere.safetensors")
    index.write_text(json.dumps({"weight_map": {"w": "../elsewhere.safetensors"}}))
    with pytest.raises(ValueError, match=r"lists the file '../elsewhere.safetensors'; an index names files of its"):
        from_pretrained(tmp_path)
