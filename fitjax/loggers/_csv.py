"""`CSVLogger`: `metrics.csv` and `hparams.yaml`, one folder per run."""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fitjax.loggers._base import check_status
from fitjax.loggers._hparams import check_params, write_yaml
from fitjax.loggers._versioned import VersionedLogger, is_int

_STEP = "step"
Row = tuple[int, dict[str, Any]]  # (step, {key: value}); old cells read back stay text


class CSVLogger(VersionedLogger):
    """Logs metrics to `<save_dir>/<name>/version_<N>/metrics.csv`, one row per step.

    The file has a `step` column and one column per metric key; calls at the same step fill one
    row, and a key that appears late widens the header (earlier rows get empty cells). Rows are
    buffered and written every `flush_every_n_rows` rows, on `save()` and on `finalize()`; the file
    is rewritten only when the header widens, so the cost stays linear in the common case.

    Args:
        save_dir: Root folder of all experiments.
        name: Experiment folder under `save_dir` ("" for none).
        version: None for the next unused `version_<N>`, an int for `version_<int>`, or a folder name.
        flush_every_n_rows: How many rows to buffer before writing.
        process_index: This process's index; defaults to `jax.process_index()`. Only 0 writes.

    Example:
        >>> logger = CSVLogger("runs")
        >>> logger.log_metrics({"train/loss": 0.7}, step=50)
        >>> logger.log_metrics({"val/loss": 0.9}, step=50)
        >>> logger.log_metrics({"train/loss": 0.5}, step=100)
        >>> logger.finalize("success")
        >>> print((logger.log_dir / "metrics.csv").read_text(), end="")
        step,train/loss,val/loss
        50,0.7,0.9
        100,0.5,
    """

    _APPENDED = ("metrics.csv",)  # rows are appended: a new mirror starts from the store's

    def __init__(
        self,
        save_dir: str | os.PathLike[str],
        name: str = "fitjax_logs",
        version: int | str | None = None,
        *,
        flush_every_n_rows: int = 100,
        process_index: int | None = None,
    ) -> None:
        super().__init__(save_dir, name, version, process_index=process_index)
        if not is_int(flush_every_n_rows) or flush_every_n_rows < 1:
            raise ValueError(
                f"`CSVLogger(flush_every_n_rows=...)` must be an int >= 1; got {flush_every_n_rows!r}."
            )
        self._flush_every = flush_every_n_rows
        self._pending: dict[int, dict[str, float]] = {}  # rows not yet in the file, by step, in order
        self._columns: dict[str, None] = {}  # an ordered set of metric keys, file's first
        self._file_columns: list[str] | None = None  # the header in the file; None until first touched
        # The file's last row and where its line starts: a later call for the same step rewrites
        # just that line instead of the whole file.
        self._last_row: Row | None = None
        self._last_row_offset = 0

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Adds `metrics` to the row of `step` (a new row unless this step already has one)."""
        if not self._is_writer() or not metrics:
            return
        if _STEP in metrics:
            raise ValueError(
                f"`CSVLogger.log_metrics(metrics)` got the key {_STEP!r}, which is the name of the step "
                f"column in metrics.csv; got keys {list(metrics)!r}. Rename that metric."
            )
        step = int(step)
        self._pending.setdefault(step, {}).update((k, float(v)) for k, v in metrics.items())
        self._columns.update(dict.fromkeys(metrics))
        self._note_step(step)
        if len(self._pending) > self._flush_every:
            # The newest row stays buffered: the next call may add to the same step.
            self._write(list(self._pending)[:-1])

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        """Writes `params` to `hparams.yaml` in the run folder (non-YAML values as strings)."""
        if not self._is_writer():
            return
        check_params("CSVLogger", params)
        write_yaml(self._open() / "hparams.yaml", params)

    def save(self) -> None:
        """Writes every buffered row to `metrics.csv`."""
        if self._is_writer():
            self._write(list(self._pending))
            self._upload()  # a store's copy, when save_dir is a URL

    def finalize(self, status: str) -> None:
        """Writes buffered rows; safe to call twice and after an exception."""
        check_status("CSVLogger", status)
        self.save()
        self._release_mirror()  # a store's local copy, uploaded by save()

    def _write(self, steps: list[int]) -> None:
        if not steps:
            return
        rows = [(step, self._pending.pop(step)) for step in steps]
        path = self._open() / "metrics.csv"
        if self._file_columns is None:
            # A run continued in an existing folder keeps the file's columns, in their order.
            self._file_columns = _read_header(path)
            self._columns = dict.fromkeys([*self._file_columns, *self._columns])
        columns, truncate_at = list(self._columns), None
        if self._last_row is not None and rows[0][0] == self._last_row[0]:
            # This step's row is already the file's last line (save() came mid-step): replace it.
            rows[0] = (rows[0][0], {**self._last_row[1], **rows[0][1]})
            truncate_at = self._last_row_offset
        purge_step = self._take_purge_step()
        if columns != self._file_columns or purge_step is not None:
            offset = _rewrite(path, columns, rows, purge_step=purge_step)
        else:
            offset = _append(path, columns, rows, truncate_at=truncate_at)
        self._file_columns = columns
        self._last_row, self._last_row_offset = rows[-1], offset


def _line(cells: list[Any]) -> bytes:
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerow(cells)
    return buffer.getvalue().encode()


def _cells(columns: list[str], step: int | str, row: Mapping[str, Any]) -> list[Any]:
    return [step, *("" if row.get(c) is None else row[c] for c in columns)]


def _read_header(path: Path) -> list[str]:
    if not path.is_file():
        return []
    with path.open(newline="") as f:
        header = next(csv.reader(f), [])
    return [c for c in header if c != _STEP]


def _append(path: Path, columns: list[str], rows: list[Row], *, truncate_at: int | None) -> int:
    """Appends `rows` (first cutting the file at `truncate_at`); returns where the last line starts."""
    lines = [_line(_cells(columns, step, row)) for step, row in rows]
    with path.open("ab" if truncate_at is None else "r+b") as f:
        if truncate_at is not None:
            f.truncate(truncate_at)
            f.seek(truncate_at)
        f.write(b"".join(lines[:-1]))
        offset = f.tell()
        f.write(lines[-1])
    return offset


def _rewrite(path: Path, columns: list[str], rows: list[Row], *, purge_step: int | None) -> int:
    """Writes the file again with `columns`: its old rows (cells kept as text), then `rows`.

    Returns where the last line starts. `rows[0]` absorbs an old last row of the same step.
    """
    old: list[dict[str, str]] = []
    if path.is_file():
        with path.open(newline="") as f:
            old = list(csv.DictReader(f))
    if purge_step is not None:
        old = [r for r in old if int(r[_STEP]) < purge_step]
    if old and old[-1][_STEP] == str(rows[0][0]):
        step, row = rows[0]
        rows[0] = (step, {**{k: v for k, v in old.pop().items() if k != _STEP}, **row})
    lines = [
        _line([_STEP, *columns]),
        *(_line(_cells(columns, r[_STEP], r)) for r in old),
        *(_line(_cells(columns, step, row)) for step, row in rows),
    ]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(b"".join(lines))
    os.replace(tmp, path)
    return sum(map(len, lines[:-1]))
