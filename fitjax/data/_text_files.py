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
from collections.abc import Callable, Iterator, Sequence
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
    Parquet record is a dict, a text record a `{"text": line}`. A byte that is not UTF-8 and a
    text field that is no string (`null`, a number) are errors naming the file, the line and
    the key."""
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
            try:
                text = line.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as error:
                at = start + error.start
                raise ValueError(
                    f"{path!r}, line {_line_of(path, start)}: the byte {line[error.start:error.start + 1]!r} at byte "
                    f"offset {at} is not UTF-8, which fitjax reads text files as. Re-encode the file (e.g. `iconv "
                    "-f latin1 -t utf-8`), or fix or drop that line.") from None
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
            _check_strings(record, lambda: f"{path!r}, line {_line_of(path, start)} (byte {start})")
            yield start, record


def _check_strings(record: Any, where: Callable[[], str]) -> None:
    """Raises unless the text fields a record is read by are strings: `"text": null` or
    `"text": 12345` would otherwise be learned as the words "None" and "12345"."""
    if not isinstance(record, dict) or "messages" in record:
        return  # not a record (said when it is encoded), or a chat: its template reads it
    keys = ("prompt", "completion") if "prompt" in record and "completion" in record else ("text",)
    for key in keys:
        if key in record and not isinstance(record[key], str):
            raise ValueError(f"{where()}: {key!r} is {record[key]!r} ({type(record[key]).__name__}), not a string. "
                             "Fix or drop that record (a record with no text to learn has no place in the data).")


def _line_of(path: str, offset: int) -> int:
    """The 1-based line number of the byte `offset` of `path` (read again: only for an error)."""
    lines, done = 1, 0
    with _open(path) as file:
        while done < offset:
            chunk = file.read(min(1 << 20, offset - done))
            if not chunk:
                break
            lines, done = lines + chunk.count(b"\n"), done + len(chunk)
    return lines


def size_of(path: str) -> int:
    """The size of file `path` in bytes (a store: one request)."""
    if _storage.is_url(path):
        fs, root = _storage._fs(path)
        return int(fs.size(root))
    return os.path.getsize(os.path.expanduser(path))


def check_position(path: str, offset: int, size: int | None, saved: dict[str, Any],
                   found: tuple[int, int] | None) -> None:
    """Raises unless a resume at the saved position `saved` (`{"offset", "size", "check"}`)
    finds the file as it was: of the same size, and the record at `offset` the one read then
    (`found`: the offset of the first record at or after it and the check of its tokens; None
    at the end of the file; `saved["check"]` None at a file's start)."""
    if size == saved["size"] and (saved["check"] is None or found == (offset, saved["check"])):
        return
    unit = "row" if format_of(path) == "parquet" else "byte"
    if size != saved["size"]:
        what = f"it holds {size} bytes, {saved['size']} then"
    elif found is None:
        what = "it now ends before it"
    else:
        what = (f"the record there is not the one read then ({unit} {found[0]}{_line(path, found[0])}: its tokens "
                "differ, or it starts elsewhere; another tokenizer would differ too)")
    raise ValueError(
        f"{path!r} changed since the data position was saved (at {unit} {offset}): {what}. The file was edited, "
        "replaced or cut between the save and this resume, and reading on from the old position would continue "
        "in other data than the run saw. Put the file back as it was, or start a new fit from the checkpoint's "
        "weights (`module.load_weights(checkpoint_folder)`) with the data read from its beginning.")


def _line(path: str, offset: int) -> str:
    return "" if format_of(path) == "parquet" else f", line {_line_of(path, offset)}"


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
                    _check_strings(table[index], lambda: f"{path!r}, row {first + index}")
                    yield first + index, table[index]
            first += rows
