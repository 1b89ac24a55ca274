"""The grain source of `TextLoader`: the records of files, tokenized (once: `_text_cache`) and
cut into pieces, with a position grain saves and restores (imported only when a `TextLoader`
iterates: grain is heavy)."""

from __future__ import annotations

import zlib

import grain
import numpy as np

from fitjax.data import _text_files
from fitjax.data._text_cache import TokenCache, Tokens


class _PiecesIterator(grain.DatasetIterator):
    """The pieces of each record of each file, from the tokens cache; the state is
    `(file, record offset, piece)`, the same whatever the process count, with the file's size
    and a check of the record's tokens by which a resume finds a file edited since
    (`_text_files.check_position`)."""

    def __init__(self, files: list[str], cache: TokenCache, seq_len: int) -> None:
        super().__init__()
        self._files, self._cache, self._seq_len = files, cache, seq_len
        self._file, self._offset, self._piece = 0, 0, 0  # the position: the record at `_offset`
        self._pieces: list | None = None  # that record's pieces, once read
        self._tokens: Tokens | None = None  # the tokens of the chunk holding it
        self._chunk = self._row = 0  # that chunk's place among the file's, and the record's in it
        self._check: int | None = None  # a CRC-32 of the record's tokens (no I/O: they are read)
        self._sizes: dict[int, int] = {}  # file -> its size, asked once (a request on a store)
        self._expect: dict | None = None  # a restored position, checked at the next read

    def __next__(self) -> dict[str, np.ndarray]:
        while self._pieces is None or self._piece >= len(self._pieces):
            self._read_record()
        self._piece += 1
        return self._pieces[self._piece - 1]

    def _read_record(self) -> None:
        """Reads the next record (or the one at the position, after `set_state`)."""
        if self._file >= len(self._files):
            raise StopIteration
        resuming = self._pieces is None  # the record at `_offset` is the position's, with `_piece` done
        chunks = self._cache.chunks_of(self._files[self._file])
        if self._tokens is None:  # the first record at or after `_offset`
            self._chunk = next((c for c, k in enumerate(chunks) if self._cache.chunks[k].end > self._offset),
                               len(chunks))
            if self._chunk < len(chunks):
                self._tokens = self._cache.get(chunks[self._chunk])
                self._row = int(np.searchsorted(self._tokens.offsets, self._offset))
        else:
            self._row += 1
        while self._tokens is None or self._row >= len(self._tokens.offsets):
            self._chunk += 1
            if self._chunk >= len(chunks):
                self._check_resume(None)
                self._file, self._offset, self._piece, self._pieces, self._tokens = self._file + 1, 0, 0, None, None
                self._check = None
                return
            self._tokens, self._row = self._cache.get(chunks[self._chunk]), 0
        ids, weights = self._tokens.record(self._row)
        self._check = zlib.crc32(ids.tobytes())
        self._check_resume((int(self._tokens.offsets[self._row]), self._check))
        self._offset, self._pieces = int(self._tokens.offsets[self._row]), _pieces(ids, weights, self._seq_len)
        self._piece = self._piece if resuming else 0

    def _check_resume(self, found: tuple[int, int] | None) -> None:
        """At the first read after `set_state`: raises unless the file is as it was saved."""
        if self._expect is not None:
            expect, self._expect = self._expect, None
            _text_files.check_position(self._files[self._file], self._offset, self._size(), expect, found)

    def _size(self) -> int | None:
        if self._file >= len(self._files):
            return None
        if self._file not in self._sizes:
            self._sizes[self._file] = _text_files.size_of(self._files[self._file])
        return self._sizes[self._file]

    def get_state(self) -> dict[str, int | None]:
        return {"file": self._file, "offset": self._offset, "piece": self._piece, "size": self._size(),
                "check": self._check}

    def set_state(self, state: dict[str, int]) -> None:
        self._file, self._offset, self._piece = int(state["file"]), int(state["offset"]), int(state["piece"])
        self._check = state.get("check")  # None at a file's start
        self._expect = state if "size" in state else None  # without: saved before these checks
        self._pieces = self._tokens = None


class Pieces(grain.IterDataset):
    """A grain dataset of the pieces of every record of `files`, in order, from `cache`."""

    def __init__(self, files: list[str], cache: TokenCache, seq_len: int) -> None:
        super().__init__()
        self._args = (files, cache, seq_len)

    def __iter__(self) -> _PiecesIterator:
        return _PiecesIterator(*self._args)


def _pieces(ids: np.ndarray, weights: np.ndarray, seq_len: int) -> list[dict[str, np.ndarray]]:
    """Next-token pairs of one example, cut into pieces of at most `seq_len`; a piece with no
    token that carries loss is dropped (it would cost compute and teach nothing)."""
    pieces = []
    for start in range(0, len(ids) - 1, seq_len):
        targets = ids[start + 1: start + seq_len + 1]
        mask = weights[start + 1: start + seq_len + 1]
        if mask.any():
            pieces.append({"tokens": ids[start: start + len(targets)], "targets": targets, "loss_mask": mask})
    return pieces


class _WindowShuffledIterator(grain.DatasetIterator):
    """The parent's elements, `window` at a time, each window in an order drawn from `seed` and
    the window's number; the state is the parent's at the window's start and the place in it."""

    def __init__(self, parent: grain.DatasetIterator, window: int, seed: tuple[int, ...]) -> None:
        super().__init__(parent)
        self._window, self._seed = window, seed
        self._start = parent.get_state()  # the parent's state where the current window began
        self._index, self._place = 0, 0  # the window's number, and how many of it were yielded
        self._elements: list | None = None

    def __next__(self) -> dict[str, np.ndarray]:
        while True:
            if self._elements is None:
                self._fill()
                if not self._elements:
                    raise StopIteration
            if self._place < len(self._elements):
                self._place += 1
                return self._elements[self._place - 1]
            self._start, self._index, self._place, self._elements = self._parent.get_state(), self._index + 1, 0, None

    def _fill(self) -> None:
        elements = []
        for element in self._parent:
            elements.append(element)
            if len(elements) == self._window:
                break
        order = np.random.default_rng([*self._seed, self._index]).permutation(len(elements))
        self._elements = [elements[i] for i in order]

    def get_state(self) -> dict:
        return {"parent": self._start, "window": self._index, "place": self._place}

    def set_state(self, state: dict) -> None:
        self._parent.set_state(state["parent"])
        self._start, self._index, self._place = state["parent"], int(state["window"]), int(state["place"])
        self._elements = None


class WindowShuffled(grain.IterDataset):
    """`parent`'s elements shuffled within windows of `window`, window `i` in the order
    `default_rng([*seed, i])` draws (grain's own window shuffle
    draws each index with a cipher that costs milliseconds per element)."""

    def __init__(self, parent: grain.IterDataset, *, window: int, seed: tuple[int, ...]) -> None:
        super().__init__(parent)
        self._window, self._seed = window, seed

    def __iter__(self) -> _WindowShuffledIterator:
        return _WindowShuffledIterator(self._parent.__iter__(), self._window, self._seed)
