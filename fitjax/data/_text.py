"""`TextLoader`: token batches from JSONL, Parquet and text files, packed or padded, streamed
through grain and resumable at any batch.

The pipeline, one grain dataset per epoch: files (in order, or shuffled per epoch) -> records
(by their byte offset or row) -> token ids and loss weights (tokenized once, each chunk of the
corpus by one process, and read back from a cache: `_text_cache`) -> pieces of at most
`seq_len` next-token pairs -> a window shuffle of `buffer_size` pieces -> rows (first-fit
packing of several pieces per row, or one padded piece per row) -> batches. Only one chunk's
tokens, the shuffle window and the packing window are held in memory, so a corpus of any size
streams. grain's iterator state is the position: the file and byte offset of
the record being read, the piece within it, and the places within the shuffle and packing
windows; restoring it re-reads at most those windows. Every process runs the same pipeline over
the same tokens and keeps its rows of each global batch, so the position is global: a run resumed
with another process count continues with the same batches.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fitjax._optional import require
from fitjax.data import _text_cache, _text_files, _tokenize
from fitjax.data._batching import _check_int

KEYS = ("loss_mask", "positions", "segment_ids", "targets", "tokens")


def packing_efficiency(batch: Mapping[str, Any]) -> jax.Array:
    """Real tokens / row slots of a `TextLoader` batch: 1.0 when no slot is padding.

    Traceable: return it from a module's `metrics` and it is logged as
    `train/packing_efficiency`.

    Example:
      >>> import numpy as np
      >>> float(packing_efficiency({"segment_ids": np.array([[1, 1, 2, 0], [1, 1, 1, 1]])}))
      0.875
    """
    return jnp.mean(jnp.asarray(batch["segment_ids"]) > 0, dtype=jnp.float32)


class TextLoader:
    """Batches of tokens from text files, packed into fixed-length rows, resumable mid-epoch.

    Each batch is a dict of `[batch_size, seq_len]` arrays: `tokens` (the model's input),
    `targets` (the next token), `loss_mask` (float32: 1 where the target carries loss, 0 for
    padding and prompts: see `completion_only`), `segment_ids` (int32: 1, 2, ... for the
    examples packed in a row, 0 for padding) and `positions` (int32: each token's position in
    its own example). Give `segment_ids` and `positions` to the model's attention
    (`fj.nn.attention(q, k, v, segment_ids=...)`) so packed examples never see each other, and
    return `fj.TokenLoss(sum=(ce * loss_mask).sum(), count=loss_mask.sum())` from `loss` so every
    token weighs the same across rows, micro-batches and devices.

    Records (see `fitjax.data._tokenize`): `{"text": ...}` (a line of a .txt file is one),
    `{"prompt": ..., "completion": ...}`, or `{"messages": [{"role", "content"}, ...]}`, a chat
    rendered by the tokenizer's chat template. An example longer than `seq_len` is cut into
    rows of `seq_len` (a later row does not see the earlier one).

    Records are tokenized once, not every epoch, and shared out by chunk of file (a JSONL or
    text file is cut every 32 MiB, a Parquet file by row group; chunk `k` of the files in listed
    order goes to process `k % process_count`): each process reads and tokenizes only its share,
    at the first `iter()` (or `tokenize()`), and stores it in the cache (see `cache`), keyed by
    each file's size and modification time and the tokenizer, so a second epoch and a second
    run tokenize nothing. Every process then reads every chunk's tokens back (one chunk in
    memory at a time) and packs them the same way, keeping its own rows of each global batch,
    as `fj.DataLoader` does: the batches, and the position, do not depend on the process count.
    The processes wait for each other's shares through `jax.distributed`'s key-value store;
    where the cache folder is not shared, a process tokenizes what it does not find (and says
    so once).

    Nothing is held but one chunk's tokens, the shuffle window (`buffer_size` pieces) and the
    packing window (`4 * batch_size` rows), so the corpus may be larger than memory (unless
    the cache is in memory). `state_dict()` is the position (JSON-friendly): a fit restored
    from a checkpoint continues with the same batches, with any process count. The last batch
    of an epoch is filled with padding rows (`loss_mask` 0) to `batch_size`, so the step never
    sees another shape.

    Args:
      files: a file, folder, glob pattern or a list of them; local paths or `s3://`, `gs://`
        URLs. Suffixes: .jsonl/.json (JSON Lines), .parquet, .txt/.text (one record per line).
      tokenizer: the folder a Hugging Face tokenizer was saved in (`save_pretrained`), a
        transformers tokenizer, or a `tokenizers.Tokenizer`. Nothing is downloaded.
      seq_len: tokens per row.
      batch_size: rows per batch, global across processes.
      pack: pack several examples per row (True) or pad each example to its own row.
      completion_only: which tokens carry loss. None (TRL's defaults): a 'prompt'/'completion'
        record's completion alone, a chat's every token. True: completions alone, and a chat's
        assistant turns alone (the tokens the template adds for each after its generation
        prompt); system and user turns, prompts and the template's markup get `loss_mask` 0.
        False: every token, prompts included.
      shuffle: shuffle the files' order per epoch and the pieces within a `buffer_size` window.
      seed: the seed of the shuffles; the epoch is mixed in.
      buffer_size: pieces in the shuffle window (memory held: about `buffer_size * seq_len`
        tokens).
      cache: where the tokens are kept: True, a `.fitjax_tokens` folder beside each data file
        (on its store for a URL); a folder (local or URL) for all files; False, this loader's
        memory only (each process then tokenizes every record, once per loader). A folder that
        cannot be written, or a tokenizer whose definition cannot be read, also keeps them in
        memory. fitjax only adds entries there (a changed file or tokenizer gets new ones);
        delete the folder to reclaim the space.
      process_index: this process's index (None: `jax.process_index()` at the first iteration).
      process_count: the number of processes (None: `jax.process_count()` likewise).

    Example:
      >>> import json, pathlib, tempfile
      >>> from tokenizers import Tokenizer, models, pre_tokenizers
      >>> folder = pathlib.Path(tempfile.mkdtemp())
      >>> lines = [{"text": "a b c d"}, {"text": "b c"}, {"text": "a d d a b"}]
      >>> _ = (folder / "data.jsonl").write_text("".join(json.dumps(r) + "\\n" for r in lines))
      >>> vocab = {w: i for i, w in enumerate(["<pad>", "</s>", "a", "b", "c", "d"])}
      >>> tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
      >>> tok.pre_tokenizer = pre_tokenizers.Whitespace()
      >>> loader = TextLoader(folder / "data.jsonl", tokenizer=tok, seq_len=8, batch_size=2)
      >>> batch = next(iter(loader))
      >>> batch["tokens"].shape, batch["segment_ids"][0].tolist()
      ((2, 8), [1, 1, 1, 1, 2, 2, 0, 0])
    """

    def __init__(self, files: str | os.PathLike | Sequence[str | os.PathLike], *, tokenizer: Any,
                 seq_len: int, batch_size: int, pack: bool = True, completion_only: bool | None = None,
                 shuffle: bool = False, seed: int = 0, buffer_size: int = 1024,
                 cache: bool | str | os.PathLike = True, process_index: int | None = None,
                 process_count: int | None = None) -> None:
        self.files = _text_files.list_files(files)
        parquet = ["pyarrow"] if any(str(f).endswith(".parquet") for f in self.files) else []
        require("grain", *parquet, feature="`fj.data.TextLoader(...)`")  # before any record is read
        self.seq_len = _check_int(seq_len, where="`TextLoader(seq_len=...)`", minimum=1)
        self.batch_size = _check_int(batch_size, where="`TextLoader(batch_size=...)`", minimum=1)
        self.buffer_size = _check_int(buffer_size, where="`TextLoader(buffer_size=...)`", minimum=1)
        self.seed = _check_int(seed, where="`TextLoader(seed=...)`", minimum=0)
        self.pack, self.shuffle = bool(pack), bool(shuffle)
        if completion_only not in (None, True, False):
            raise ValueError(f"`TextLoader(completion_only=...)` must be None (a prompt's completion alone is learned, "
                             f"a chat's every token), True (completions and assistant turns alone) or False "
                             f"(every token); received {completion_only!r}.")
        self.encoder = _tokenize.Encoder(_tokenize.load_tokenizer(tokenizer), completion_only=completion_only)
        if not isinstance(cache, (bool, str, os.PathLike)):
            raise TypeError(f"`TextLoader(cache=...)` must be True (beside the data), a folder, or False (in "
                            f"memory); received {cache!r}.")
        self._cache = _text_cache.TokenCache(self.files, self.encoder, cache)
        self._process_index, self._process_count = process_index, process_count
        self._epoch = 0
        self._iterator: Any = None
        self._pending: Any = None  # a loaded iterator state, applied by the next iter()
        self._tokens = self._slots = 0

    @property
    def tokenizer(self) -> Any:
        """The tokenizer the records are encoded with."""
        return self.encoder.tokenizer

    @property
    def packing_efficiency(self) -> float:
        """Real tokens / row slots over the batches this object has yielded (0.0 before any)."""
        return self._tokens / self._slots if self._slots else 0.0

    @property
    def local_batch_size(self) -> int:
        """Rows per batch on this process: `batch_size // process_count`."""
        return self.batch_size // self._processes()[1]

    def tokenize(self) -> int:
        """Tokenizes this process's share of the records that are not cached yet, then waits for
        the other processes' shares; returns the number of records this call tokenized.

        The first `iter()` does it; call it ahead (in `prepare_data`, or a job of its own on
        each process) to have the cache ready before training starts.
        """
        return self._cache.prepare(*self._processes())

    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch the next `iter()` reads; another epoch than a loaded state's starts over."""
        epoch = _check_int(epoch, where="`TextLoader.set_epoch(epoch)`", minimum=0)
        if epoch != self._epoch:
            self._epoch, self._pending, self._iterator = epoch, None, None

    def state_dict(self) -> dict[str, Any]:
        """The position: `{"epoch": ..., "iterator": grain's iterator state}`."""
        state = self._pending if self._iterator is None else self._iterator.get_state()
        return {"epoch": self._epoch, "iterator": state}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores a position from `state_dict()`; the next `iter()` continues from it."""
        if not isinstance(state, Mapping) or set(state) != {"epoch", "iterator"}:
            raise ValueError("`TextLoader.load_state_dict(state)` expects the dict from `state_dict()`, with "
                             f"keys 'epoch' and 'iterator'; received {state!r}.")
        self._epoch = _check_int(state["epoch"], where="`state['epoch']`", minimum=0)
        self._pending, self._iterator = state["iterator"], None

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        self.tokenize()
        self._iterator = iter(self._dataset(self._epoch))
        if self._pending is not None:
            pending, self._pending = self._pending, None
            self._iterator.set_state(pending)
        return self._batches(self._iterator, *self._processes())

    def _batches(self, iterator: Any, index: int, count: int) -> Iterator[dict[str, np.ndarray]]:
        local = self.batch_size // count
        for batch in iterator:
            batch = _filled(batch, self.batch_size, self.seq_len)
            self._tokens += int((batch["segment_ids"] > 0).sum())
            self._slots += batch["segment_ids"].size
            yield {key: value[index * local: (index + 1) * local] for key, value in batch.items()}

    def _dataset(self, epoch: int) -> Any:
        import grain  # noqa: PLC0415 - grain is heavy: imported when text is read

        from fitjax.data._text_pieces import Pieces, WindowShuffled  # noqa: PLC0415 - imports grain

        files = list(self.files)
        if self.shuffle:
            files = [files[i] for i in np.random.default_rng([self.seed, epoch]).permutation(len(files))]
        data = Pieces(files, self._cache, self.seq_len)
        if self.shuffle:
            data = WindowShuffled(data, window=self.buffer_size, seed=(self.seed, epoch))
        if self.pack:  # first fit over 4 batches' rows: a resume replays at most that window
            data = grain.experimental.FirstFitPackIterDataset(
                data, length_struct={"tokens": self.seq_len, "targets": self.seq_len, "loss_mask": self.seq_len},
                num_packing_bins=4 * self.batch_size, shuffle_bins=False).map(_renamed)
        else:
            data = data.map(lambda piece: _padded(piece, self.seq_len))
        return data.batch(self.batch_size, drop_remainder=False)

    def _processes(self) -> tuple[int, int]:
        index = jax.process_index() if self._process_index is None else self._process_index
        count = jax.process_count() if self._process_count is None else self._process_count
        if self.batch_size % count:
            raise ValueError(f"`TextLoader(batch_size={self.batch_size!r})` is the global batch size and must divide "
                             f"evenly over the {count} processes; use a multiple of {count}.")
        if not 0 <= index < count:
            raise ValueError(f"`TextLoader(process_index=...)` must be in [0, {count}) for {count} processes; "
                             f"received {index!r}.")
        return index, count

    def __repr__(self) -> str:
        return (f"TextLoader(files={len(self.files)}, seq_len={self.seq_len}, batch_size={self.batch_size}, "
                f"pack={self.pack}, completion_only={self.encoder.completion_only}, shuffle={self.shuffle})")


def _renamed(row: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"tokens": row["tokens"], "targets": row["targets"], "loss_mask": row["loss_mask"].astype(np.float32),
            "segment_ids": row["tokens_segment_ids"].astype(np.int32),
            "positions": row["tokens_positions"].astype(np.int32)}


def _padded(piece: dict[str, np.ndarray], seq_len: int) -> dict[str, np.ndarray]:
    n, pad = len(piece["tokens"]), seq_len - len(piece["tokens"])
    row = {key: np.pad(value, (0, pad)) for key, value in piece.items()}
    row["segment_ids"] = np.pad(np.ones(n, np.int32), (0, pad))
    row["positions"] = np.pad(np.arange(n, dtype=np.int32), (0, pad))
    return row


def _filled(batch: dict[str, np.ndarray], rows: int, seq_len: int) -> dict[str, np.ndarray]:
    """`batch` with padding rows (segment 0, no loss) up to `rows`: an epoch's last batch."""
    have = len(batch["tokens"])
    if have == rows:
        return batch
    return {key: np.concatenate([value, np.zeros((rows - have, seq_len), value.dtype)]) for key, value in batch.items()}
