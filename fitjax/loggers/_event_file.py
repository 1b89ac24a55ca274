"""A TensorBoard event file written by the thread that logs, not through tensorboardX's queue.

tensorboardX's `SummaryWriter` hands each event to a writer thread through a
`multiprocessing.Queue`: the event is pickled, a feeder thread writes it into a pipe, the writer
thread reads and unpickles it, then writes the record. On the tiny MLP of
`benchmarks/overhead.py` (a ~85 µs step, a row every 50 steps) that cost ~450 µs of wall time a
row, spread over three threads competing for the GIL: +9 µs a step, 11% of the step, where a
logger that does nothing cost nothing (`benchmarks/host_profile.py`). Writing the record itself
(serialise, two CRC32Cs, an append to a buffered file) takes ~12 µs.

So `synchronous(writer)` takes over a new `SummaryWriter`'s event file: the records are appended
by the caller to the same file (Python's buffered writer: a system call per 8 KiB), flushed at
most every `flush_secs` when an event is added, and by `flush()`/`close()`. A side effect:
`flush()` now writes every event added before it; tensorboardX's flush did not wait for the
events still in its queue. Where tensorboardX's internals are not what this was written against,
the writer is left as it is (slower, same file).
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["synchronous"]


class _EventFile:
    """What tensorboardX's `FileWriter` calls on its `event_writer`, writing in the caller's thread."""

    def __init__(self, records: Any, logdir: str, flush_secs: float) -> None:
        self._records = records  # tensorboardX's `EventsWriter`: the file, its header written
        self._logdir = logdir
        self._flush_secs = flush_secs
        self._next_flush = 0.0  # the first event reaches the disk at once (as tensorboardX's)
        self._closed = False

    def get_logdir(self) -> str:
        return self._logdir

    def add_event(self, event: Any) -> None:
        if self._closed:
            return
        self._records.write_event(event)
        now = time.monotonic()
        if now >= self._next_flush:
            self._records.flush()
            self._next_flush = now + self._flush_secs

    def flush(self) -> None:
        if not self._closed:
            self._records.flush()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._records.close()

    def reopen(self) -> None:
        if self._closed:
            raise RuntimeError("this event file is closed; the TensorBoardLogger opens a new one at its next write")


def synchronous(writer: Any, flush_secs: float) -> Any:
    """`writer` (a new tensorboardX `SummaryWriter`) with its events written by the caller."""
    file_writer = getattr(writer, "file_writer", None)
    queued = getattr(file_writer, "event_writer", None)
    needed = ("_worker", "_event_queue", "_ev_writer", "get_logdir")
    if queued is None or not all(hasattr(queued, name) for name in needed) or queued._worker is None:
        return writer  # not the tensorboardX this was written against: its own writer stays
    queued._worker.stop()  # writes what it was given (a purge step's events), then ends
    queued._event_queue.close()
    queued._event_queue.join_thread()  # the queue's feeder thread, started by `stop`, has ended
    queued._worker = queued._event_queue = None
    queued._closed = True  # its atexit hook and its own close leave the file to us
    file_writer.event_writer = _EventFile(queued._ev_writer, queued.get_logdir(), flush_secs)
    return writer
