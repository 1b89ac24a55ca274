"""The tokens of `TextLoader`'s records, computed once and shared out between the processes.

The corpus is cut into chunks: a JSONL or text file every `CHUNK_BYTES` bytes (a chunk holds the
records whose line starts in its byte range), a Parquet file by row group. The chunks are
numbered in the order the files are listed, and chunk `k` is tokenized by process
`k % process_count` only, so each process reads and tokenizes about `1 / process_count` of the
records. A tokenized chunk is written (atomically: a temporary file of this process renamed into
place, or one object upload on a store) to a `.fitjax_tokens` folder beside its data file, or to
the `cache` folder given; its name holds a key of the file's size and modification time, the
tokenizer (its serialized form and chat template), the encoding options and the chunk's range, so
a changed file or tokenizer is tokenized again and never read from a stale entry. Nothing is ever
deleted there (only this process's own temporary file, when a write fails): remove the folder to
reclaim the space.

Every process then reads the tokens of every chunk from the cache (one chunk in memory at a time:
reading int32 arrays costs a small fraction of tokenizing) and runs the same packing, so the
global batches and the position do not depend on the process count. Where a chunk cannot be
written (a read-only folder, `cache=False`, a tokenizer whose identity cannot be read) its tokens
stay in this process's memory for the loader's life: tokenized once per loader, not per epoch.
Where another process's chunk is not found once that process said it was done (the processes do
not share the folder), this process tokenizes it too, and says so once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import os
import uuid
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np

from fitjax import _stack, _storage
from fitjax.data import _text_files, _tokenize

CHUNK_BYTES = 32 << 20  # a chunk of a JSONL or text file: about 8M tokens, one chunk in memory
FOLDER = ".fitjax_tokens"
_FORMAT = 1  # part of every key: bump it when the stored layout or the encoding of records changes
_WAIT_MS = 3_600_000  # how long a process waits for the others' shares before tokenizing them itself
_SAY_MS = 60_000  # a wait longer than this is said, once


@dataclasses.dataclass(frozen=True)
class Chunk:
    """The records of `path` that start at a byte (JSONL, text) or row (Parquet) in `[start, end)`."""

    path: str
    start: int
    end: int
    stamp: str  # the file's size and modification time


@dataclasses.dataclass(frozen=True)
class Tokens:
    """One chunk's records, tokenized: record `i` starts at `offsets[i]` in its file and its
    tokens are `ids[bounds[i]:bounds[i + 1]]`, with `weights` 1 where a token carries loss."""

    offsets: np.ndarray  # int64 [records]
    bounds: np.ndarray  # int64 [records + 1]
    ids: np.ndarray  # int32 [tokens]
    weights: np.ndarray  # uint8 [tokens]

    def record(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Record `i`'s token ids (int32) and loss weights (float32), as the encoder gives them."""
        a, b = int(self.bounds[i]), int(self.bounds[i + 1])
        return self.ids[a:b], self.weights[a:b].astype(np.float32)


def tokenizer_identity(encoder: _tokenize.Encoder) -> str | None:
    """A digest of everything that decides the encoder's output, or None when the tokenizer's
    full definition cannot be read (then nothing is cached on disk: a key would not be safe)."""
    tokenizer = encoder.tokenizer
    core = getattr(tokenizer, "backend_tokenizer", tokenizer)
    if callable(getattr(core, "to_str", None)):
        definition = core.to_str()  # the vocabulary, merges, normalizer, BOS/EOS post-processor
    elif callable(getattr(tokenizer, "get_vocab", None)):
        definition = json.dumps(sorted(tokenizer.get_vocab().items()))
    else:
        return None
    extra = [type(tokenizer).__qualname__, getattr(tokenizer, "chat_template", None),
             repr(getattr(tokenizer, "special_tokens_map", None)), encoder.eos_id, encoder.completion_only, _FORMAT]
    return hashlib.sha256((definition + json.dumps(extra, default=repr)).encode()).hexdigest()


def list_chunks(files: list[str]) -> list[Chunk]:
    """The chunks of `files`, in order: a stat of each file and a Parquet file's footer."""
    chunks = []
    for path in dict.fromkeys(files):  # a file listed twice is one file's chunks
        size, stamp = _stat(path)
        if _text_files.format_of(path) == "parquet":
            ends = np.cumsum(_row_groups(path)).tolist()
        else:
            ends = [min(end, size) for end in range(CHUNK_BYTES, size + CHUNK_BYTES, CHUNK_BYTES)]
        chunks += [Chunk(path, start, end, stamp) for start, end in zip([0, *ends[:-1]], ends) if end > start]
    return chunks


def _stat(path: str) -> tuple[int, str]:
    if _storage.is_url(path):
        fs, root = _storage._fs(path)
        info = fs.info(root)
        changed = [info.get(k) for k in ("mtime", "updated", "LastModified", "ETag", "etag", "generation")]
        return int(info["size"]), f"{info['size']}:{changed}"
    stat = os.stat(os.path.expanduser(path))
    return stat.st_size, f"{stat.st_size}:{stat.st_mtime_ns}"


def _row_groups(path: str) -> list[int]:
    import pyarrow.parquet as pq  # noqa: PLC0415 - only for Parquet files

    with _text_files._open(path) as file:
        metadata = pq.ParquetFile(file).metadata
        return [metadata.row_group(g).num_rows for g in range(metadata.num_row_groups)]


def _whole_path(path: str) -> str:
    return path if _storage.is_url(path) else os.path.abspath(os.path.expanduser(path))


def _records(chunk: Chunk) -> Iterator[tuple[int, Any]]:
    start = chunk.start
    if start and _text_files.format_of(chunk.path) != "parquet":
        with _text_files._open(chunk.path) as file:  # the first line that starts at or after `start`
            file.seek(start - 1)
            start += len(file.readline()) - 1
    with contextlib.closing(_text_files.records(chunk.path, start)) as records:
        for offset, record in records:
            if offset >= chunk.end:
                return
            yield offset, record


def tokenize(chunk: Chunk, encoder: _tokenize.Encoder) -> Tokens:
    """`chunk`'s records through `encoder`."""
    offsets, bounds, ids, weights = [], [0], [], []
    for offset, record in _records(chunk):
        record_ids, record_weights = encoder(record, f"{chunk.path!r} (record at {offset})")
        offsets.append(offset)
        bounds.append(bounds[-1] + len(record_ids))
        ids.append(record_ids)
        weights.append(record_weights)
    return Tokens(np.asarray(offsets, np.int64), np.asarray(bounds, np.int64),
                  np.concatenate(ids or [np.zeros(0, np.int32)]).astype(np.int32),
                  np.concatenate(weights or [np.zeros(0)]).astype(np.uint8))


def _to_bytes(tokens: Tokens) -> bytes:
    out = io.BytesIO()
    for array in (tokens.offsets, tokens.bounds, tokens.ids, tokens.weights):
        np.save(out, array, allow_pickle=False)
    return out.getvalue()


def _from_bytes(data: bytes) -> Tokens | None:
    """The tokens stored in `data`, or None when they are not a whole, consistent entry (checked
    before any offset in them is used)."""
    try:
        source = io.BytesIO(data)
        tokens = Tokens(*(np.load(source, allow_pickle=False) for _ in range(4)))
    except (ValueError, OSError, EOFError):
        return None
    n, bounds = len(tokens.offsets), tokens.bounds
    dtypes = (tokens.offsets.dtype, bounds.dtype, tokens.ids.dtype, tokens.weights.dtype)
    if (dtypes != (np.int64, np.int64, np.int32, np.uint8) or len(bounds) != n + 1 or bounds[0] != 0
            or bounds[-1] != len(tokens.ids) or len(tokens.ids) != len(tokens.weights) or (np.diff(bounds) < 0).any()):
        return None
    return tokens


class TokenCache:
    """The tokens of every chunk of `files`, each tokenized once: see the module docstring.

    Args:
      files: the data files, as `TextLoader` lists them.
      encoder: records to token ids and loss weights.
      cache: True: a `.fitjax_tokens` folder beside each data file; a folder (local or a URL)
        for all of them; False: this object's memory only.
    """

    def __init__(self, files: list[str], encoder: _tokenize.Encoder, cache: bool | str | os.PathLike) -> None:
        self._files, self._encoder, self._cache = files, encoder, cache
        self._chunks: list[Chunk] | None = None
        self._by_path: dict[str, list[int]] = {}
        self._identity: str | None = None
        self._memory: dict[int, Tokens] = {}  # chunks that are not on disk (or were not writable)
        self._prepared: set[tuple[int, int]] = set()
        self._mine: set[int] = set()  # the chunks of this process's share
        self._told_shared = self._told_written = False  # each warning once per loader

    @property
    def chunks(self) -> list[Chunk]:
        """Every chunk, listed at the first use (a stat of each file)."""
        if self._chunks is None:
            self._chunks = list_chunks(self._files)
            for k, chunk in enumerate(self._chunks):
                self._by_path.setdefault(chunk.path, []).append(k)
            self._identity = tokenizer_identity(self._encoder) if self._cache is not False else None
        return self._chunks

    def chunks_of(self, path: str) -> list[int]:
        """The numbers of `path`'s chunks, in file order."""
        self.chunks  # noqa: B018 - listed at the first use
        return self._by_path.get(path, [])

    def share(self, index: int, count: int) -> list[int]:
        """The chunks process `index` of `count` tokenizes."""
        return list(range(index, len(self.chunks), count))

    def prepare(self, index: int, count: int) -> int:
        """Tokenizes this process's share of the chunks that are not stored yet, then waits for the
        other processes to have done theirs; returns the number of records it tokenized."""
        if (index, count) in self._prepared:
            return 0
        tokenized = 0
        self._mine = set(self.share(index, count))
        for k in sorted(self._mine):
            if k not in self._memory and not self._exists(k):  # a broken entry is made again when read
                tokenized += len(self._tokenize(k).offsets)
        if count > 1 and self._identity is not None:
            self._wait_for_others(index, count)
        self._prepared.add((index, count))
        return tokenized

    def get(self, k: int) -> Tokens:
        """Chunk `k`'s tokens: from memory, from the cache, or tokenized here."""
        if k in self._memory:
            return self._memory[k]
        stored = self._stored(k)
        if stored is not None:
            return stored
        if k not in self._mine and self._prepared and self._identity is not None and not self._told_shared:
            self._told_shared = True
            warnings.warn(f"TextLoader: another process's tokens of {self.chunks[k].path!r} are not at "
                          f"{self._location(k)!r}; this process tokenizes them too. Give `TextLoader(cache=...)` a "
                          "folder every process sees (a shared disk or a bucket) to tokenize each record once.",
                          stacklevel=_stack.user_stacklevel())
        return self._tokenize(k)

    def _location(self, k: int) -> str | None:
        """Where chunk `k`'s tokens are stored, or None when they are kept in memory."""
        if self._identity is None:
            return None
        chunk = self.chunks[k]
        # beside the data, the folder tells the files apart (and the entries move with it); in one
        # folder for all, the file's whole path does
        where = os.path.basename(chunk.path) if self._cache is True else _whole_path(chunk.path)
        key = hashlib.sha256(f"{self._identity}|{where}|{chunk.stamp}|{chunk.start}-{chunk.end}".encode())
        name = f"{os.path.basename(chunk.path)}.{chunk.start}-{chunk.end}.{key.hexdigest()[:24]}.npy"
        if self._cache is True:
            return f"{_whole_path(chunk.path).rsplit('/', 1)[0]}/{FOLDER}/{name}"
        return f"{_whole_path(os.fspath(self._cache)).rstrip('/')}/{name}"

    def _exists(self, k: int) -> bool:
        """Whether chunk `k` has an entry in the cache (not read: a run over a cached corpus starts
        at once)."""
        location = self._location(k)
        if location is None:
            return False
        if _storage.is_url(location):
            fs, root = _storage._fs(location)
            return bool(_storage.retried("listing", location, lambda: fs.exists(root)))
        return os.path.isfile(location)

    def _stored(self, k: int) -> Tokens | None:
        location = self._location(k)
        if location is None:
            return None
        if _storage.is_url(location):
            data = _storage.get_bytes(location)
        else:
            try:
                with open(location, "rb") as file:
                    data = file.read()
            except OSError:  # none there (or no folder: a path through a file), or unreadable
                return None
        return None if data is None else _from_bytes(data)

    def _tokenize(self, k: int) -> Tokens:
        tokens = tokenize(self.chunks[k], self._encoder)
        location = self._location(k)
        if location is None or not self._write(location, _to_bytes(tokens)):
            self._memory[k] = tokens
        return tokens

    def _write(self, location: str, data: bytes) -> bool:
        """Writes one entry whole (True), or says why it could not and returns False."""
        if _storage.is_url(location):
            _storage.put_bytes(location, data)  # an object appears whole or not at all
            return True
        temporary = f"{location}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp"
        try:
            os.makedirs(os.path.dirname(location), exist_ok=True)
            with open(temporary, "wb") as file:
                file.write(data)
            os.replace(temporary, location)  # readers see the old entry or the whole new one
            return True
        except OSError as error:
            with contextlib.suppress(OSError):
                os.remove(temporary)  # this process's own file, never another's
            if not self._told_written:
                self._told_written = True
                warnings.warn(f"TextLoader: cannot write the tokens cache {location!r} ({error}); the tokens are "
                              "kept in memory for this loader. Pass `TextLoader(cache=folder)` with a writable "
                              "folder to tokenize once across runs.", stacklevel=_stack.user_stacklevel())
            return False

    def _wait_for_others(self, index: int, count: int) -> None:
        """Tells the other processes this one's share is stored, and waits (bounded) for theirs,
        through the key-value store of `jax.distributed` (none without it: nothing to wait for)."""
        import jax  # noqa: PLC0415 - the process count of the run

        from fitjax._jax_compat import distributed_client  # noqa: PLC0415 - the runtime's key-value store

        client = distributed_client()
        if client is None or jax.process_count() != count:
            return
        names = "|".join(self._location(k) or "" for k in range(len(self.chunks)))
        key = f"fitjax/text_tokens/{hashlib.sha256(f'{names}|{count}'.encode()).hexdigest()[:24]}"
        with contextlib.suppress(Exception):  # said before, by an earlier loader of the same data
            client.key_value_set(f"{key}/{index}", "stored")
        for other in range(count):
            if other != index:
                self._wait_for(client, f"{key}/{other}", other)

    def _wait_for(self, client: Any, key: str, other: int) -> None:
        waited = 0
        while waited < _WAIT_MS:
            try:
                client.blocking_key_value_get(key, _SAY_MS)
                return
            except Exception:  # noqa: BLE001 - not said yet: the other process is slow, or not iterating
                waited += _SAY_MS
                if waited == _SAY_MS:
                    warnings.warn(f"TextLoader: waiting for process {other} to tokenize its share of the records "
                                  "(every process iterates a TextLoader, or calls `tokenize()`, for the shares "
                                  "to be made).", stacklevel=_stack.user_stacklevel())
        warnings.warn(f"TextLoader: process {other} did not store its share of the tokens within "
                      f"{_WAIT_MS // 1000} s; this process tokenizes what it does not find.",
                      stacklevel=_stack.user_stacklevel())
