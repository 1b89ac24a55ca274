"""Records from text files: JSONL, Parquet and plain text, on local disk or an object store
(`s3://`, `gs://`), read one record at a time from a position that can be saved and resumed.

A position is `(file, offset)`: the byte offset of a line for JSONL and text files (a resume
seeks there, so nothing before it is read again), the row for Parquet (a resume reads the row
group holding it, one row group in memory at a time). Files are opened through fsspec for URLs,
the file layer fitjax's checkpoints use (`fitjax._storage`).
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Iterator, Sequence
from typing import Any

from fitjax import _storage

FORMATS = {".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet", ".txt": "text", ".text": "text"}


def format_of(path: str) -> str:
    """`"jsonl"`, `"parquet"` or `"text"`, from the file's suffix."""
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in FORMATS:
        raise ValueError(
            f"`files` holds {path!r}, whose suffix {suffix!r} is not a text format fitjax reads; "
            f"allowed: {sorted(FORMATS)} (JSON Lines, Parquet, plain text with one record per line). "
            "Rename the file or convert it.")
    return FORMATS[suffix]


def list_files(files: str | os.PathLike | Sequence[str | os.PathLike]) -> list[str]:
    """The files named by `files`: a file, a folder (its files of known suffixes, sorted), a glob
    pattern, or a list of these; URLs alike."""
    entries = [files] if isinstance(files, (str, os.PathLike)) else list(files)
    if not entries:
        raise ValueError("`files` is empty; pass a file, a folder, a glob pattern or a list of them.")
    found: list[str] = []
    for entry in entries:
        entry = os.fspath(entry)
        found.extend(_expand(entry))
    for path in found:
        format_of(path)
    return found


def _expand(entry: str) -> list[str]:
    if _storage.is_url(entry):
        fs, root = _storage._fs(entry)
        scheme = entry.split("://")[0]
        if any(c in root for c in "*?["):
            names = sorted(fs.glob(root))
        elif fs.isdir(root):
            names = sorted(n for n in fs.find(root) if os.path.splitext(n)[1].lower() in FORMATS)
        else:
            names = [root] if fs.exists(root) else []
        paths = [f"{scheme}://{name}" for name in names]
    elif any(c in entry for c in "*?["):
        paths = sorted(glob.glob(os.path.expanduser(entry), recursive=True))
    elif os.path.isdir(entry):
        paths = sorted(os.path.join(folder, name) for folder, _, names in os.walk(entry) for name in names
                       if os.path.splitext(name)[1].lower() in FORMATS)
    else:
        paths = [entry] if os.path.exists(os.path.expanduser(entry)) else []
    if not paths:
        raise FileNotFoundError(f"`files` entry {entry!r} names no file (nothing exists there, or a folder "
                                f"with no {sorted(FORMATS)} files); check the path.")
    return paths


def _open(path: str):
    if _storage.is_url(path):
        fs, root = _storage._fs(path)
        return fs.open(root, "rb")
    return open(os.path.expanduser(path), "rb")


def records(path: str, offset: int) -> Iterator[tuple[int, Any]]:
    """`(offset of the record, record)` of each record of `path` from `offset` on; a JSONL or
    Parquet record is a dict, a text record a `{"text": line}`."""
    kind = format_of(path)
    if kind == "parquet":
        yield from _parquet_rows(path, offset)
        return
    with _open(path) as file:
        file.seek(offset)
        while True:
            line = file.readline()
            if not line:
                return
            start, offset = offset, offset + len(line)
            text = line.decode("utf-8").rstrip("\r\n")
            if not text.strip():
                continue
            if kind == "text":
                yield start, {"text": text}
                continue
            try:
                record = json.loads(text)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path!r}: the line at byte {start} is not JSON ({error}); each line of a "
                                 f".jsonl file must be one JSON object. Fix or drop that line.") from None
            yield start, record


def _parquet_rows(path: str, row: int) -> Iterator[tuple[int, Any]]:
    import pyarrow.parquet as pq  # noqa: PLC0415 - only for Parquet files

    with _open(path) as file:
        parquet = pq.ParquetFile(file)
        first = 0
        for group in range(parquet.num_row_groups):
            rows = parquet.metadata.row_group(group).num_rows
            if row < first + rows:  # one row group in memory at a time
                table = parquet.read_row_group(group).to_pylist()
                for index in range(max(row - first, 0), rows):
                    yield first + index, table[index]
            first += rows
