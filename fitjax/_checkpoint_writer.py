"""Writing checkpoints during fit: one Orbax save at a time on a background thread.

What a save costs the loop (measured by `benchmarks/checkpoint.py`): copying the state to the host
(a small state is one `device_get`, well under a millisecond) and starting a thread. Orbax's own
asynchronous checkpointer blocks the caller ~9-13 ms per save on this project's 2-core machine
(temporary folders, metadata and a thread pool set up on the caller's thread), the synchronous
one ~70-100 ms: both over the 15 ms budget for a state under 1 MB. The thread here runs Orbax's
synchronous `Checkpointer`, which keeps Orbax's atomic finalisation: a checkpoint is written
under `<name>.orbax-checkpoint-tmp-<n>` and renamed to `<name>` once complete.

Faults: a save that fails on the thread is reported by `raise_failure()`, which the callback calls
at every step, so it surfaces at the first step after the failure, and the `on_failure` callback
given with it undoes what the save promised (best and last paths). Old checkpoints are deleted
by renaming them to a temporary name first (atomic), then removing the files: a kill half-way
leaves a folder `cleanup()` recognises, never a half-deleted checkpoint under its real name.
A state that is not fully addressable from this process (several processes) is handed to Orbax's
`AsyncCheckpointer`, which copies this process's shards to the host before returning.
"""

from __future__ import annotations

import os
import queue
import shutil
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable

import jax

from fitjax import checkpoint
from fitjax.checkpoint import SaveFailed
from fitjax._lazy import LazyModule

ocp = LazyModule("orbax.checkpoint")  # imported at the first save

_DELETING = checkpoint.TMP_MARK + "-deleting"  # an old checkpoint on its way out


class CheckpointWriter:
    """Saves `(state, meta)` checkpoints into one folder, one at a time, off the loop's thread.

    Args:
        directory: the absolute folder the checkpoints go in.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._worker: threading.Thread | None = None  # started at the first save, lives on
        self._pending: threading.Event | None = None  # set when the save in flight is done
        self._failure: tuple[str, BaseException, Callable[[], None] | None] | None = None
        self._lock = threading.Lock()
        self._primary = jax.process_index() == 0

    # --------------------------------------------------------------------------- before a run

    def prepare(self) -> None:
        """Creates the folder and proves it writable: an error now, before the first step,
        rather than at the first save."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            probe = self.directory / f".fitjax-write-probe-{os.getpid()}-{jax.process_index()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as error:
            raise PermissionError(
                f"ModelCheckpoint cannot write checkpoints to {str(self.directory)!r}: {error}. "
                "Pass a writable ModelCheckpoint(dirpath=...) or Trainer(default_root_dir=...)."
            ) from None

    def cleanup(self) -> list[Path]:
        """Removes leftovers of interrupted saves (`*.orbax-checkpoint-tmp*`) and deletions, on
        process 0. Call it when a run starts, before any save: a save in flight looks the same."""
        if not self._primary:
            return []
        removed = []
        for path in self.directory.iterdir():
            if checkpoint.TMP_MARK in path.name and path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
        return removed

    # ------------------------------------------------------------------------------ saving

    def save(self, name: str, state: Any, meta: dict[str, Any], *, delete: Iterable[str] = (),
             on_failure: Callable[[], None] | None = None) -> Path:
        """Starts writing checkpoint `name`; then deletes the checkpoints named in `delete`.

        Waits for the previous save first (and raises its failure). `on_failure` runs on the
        loop's thread when this save's failure is raised.
        """
        self.wait()
        path = self.directory / name
        if not (self.directory.is_dir() and os.access(self.directory, os.W_OK)):  # a folder made read-only mid-run: say so now
            raise SaveFailed(f"ModelCheckpoint cannot write {str(path)!r}: the folder is not "
                             "writable (any more).")
        meta = {**meta, "saved_at": time.time()}
        if all(getattr(x, "is_fully_addressable", True) for x in jax.tree.leaves(state)):
            # The step donates the state's buffers: the thread must own a host copy.
            args = checkpoint.save_args(state, meta, to_host=True)
            write = lambda: ocp.Checkpointer(ocp.CompositeCheckpointHandler()).save(path, args=args)
        else:
            args = checkpoint.save_args(state, meta)
            saver = ocp.AsyncCheckpointer(ocp.CompositeCheckpointHandler())
            saver.save(path, args=args)  # returns once this process's shards are on the host

            def write():
                saver.wait_until_finished()
                saver.close()

        doomed = [self.directory / old for old in delete if old != name]
        self._pending = threading.Event()
        if self._worker is None:  # one thread for the run: starting one per save costs ~10 ms
            self._worker = threading.Thread(target=self._work, name="fitjax-checkpoint", daemon=True)
            self._worker.start()
        self._jobs.put((path, write, doomed, on_failure, self._pending))
        return path

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            path, write, doomed, on_failure, done = job
            try:
                self._write(path, write, doomed, on_failure)
            finally:
                done.set()

    def _write(self, path: Path, write: Callable[[], Any], doomed: list[Path],
               on_failure: Callable[[], None] | None) -> None:
        try:
            write()
        except BaseException as error:  # noqa: BLE001 - reported on the loop's thread
            with self._lock:
                self._failure = (str(path), error, on_failure)
            return
        if self._primary:
            for old in doomed:
                _delete(old)

    def raise_failure(self) -> None:
        """Raises `SaveFailed` if a save failed since the last call (cheap: no waiting)."""
        with self._lock:
            failure, self._failure = self._failure, None
        if failure is None:
            return
        path, error, on_failure = failure
        if on_failure is not None:
            on_failure()
        raise SaveFailed(f"ModelCheckpoint could not save {path!r}: {type(error).__name__}: "
                         f"{_first_line(error)}") from error

    def close(self) -> None:
        """Waits for the save in flight and ends the writer's thread (failures stay pending)."""
        if self._pending is not None:
            self._pending.wait()
        if self._worker is not None:
            self._jobs.put(None)
            self._worker.join()
            self._worker = None

    def wait(self) -> None:
        """Blocks until the save in flight is written, then raises its failure, if any."""
        if self._pending is not None:
            self._pending.wait()
            self._pending = None
        self.raise_failure()


def _delete(path: Path) -> None:
    """Renames `path` out of the way (atomic), then removes its files."""
    if not path.exists():
        return
    doomed = path.with_name(f"{path.name}{_DELETING}-{time.monotonic_ns()}")
    try:
        path.rename(doomed)
    except OSError:
        return  # gone already, or not ours to delete: the next run's cleanup retries nothing
    shutil.rmtree(doomed, ignore_errors=True)


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0][:300] if text else repr(error)
