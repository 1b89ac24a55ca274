"""Writing checkpoints during fit: one writer per process, every save through it, in order.

Every save of the process (each `ModelCheckpoint`, `Trainer.save_checkpoint`, the save after
SIGTERM) is queued on `writer()`, whose one thread writes them one after the other. Orbax keeps
process-wide state for a save in progress (its temporary folders, its signalling between
threads): two saves at once, as two checkpoint callbacks each with a thread of its own used to
run, collide in it (`FileNotFoundError` on `...orbax-checkpoint-tmp/meta...`, timeouts waiting for
`item_directory_creation`).

What a save costs the loop (measured by `benchmarks/checkpoint.py`): copying the state to the host
(a small state is one `device_get`, well under a millisecond), once per step however many saves
that step makes: saves of one state share its host copy and queue without waiting, and a save of
a newer state first waits for the queued ones (so at most one step's copies are held). Orbax's own
asynchronous checkpointer blocks the caller ~9-13 ms per save on this project's 2-core machine,
the synchronous one ~70-100 ms: both over the 15 ms budget for a state under 1 MB. On an
accelerator with room for it the copy is made within the devices' memory instead, and brought
to the host on the writer's thread while the loop goes on (`_HostCopy`): the host transfer of
GPT-2 small's 1.42 GiB state held a TPU v5e chip idle 383 ms a save. The copy's own transfer
still slows the chip's steps while it runs (~0.2 s over the steps beside it for that state,
`benchmarks/save_probe.py`), so the writer counts its time (`transfer_seconds`) for the default
checkpoint to charge to its budget. The thread
runs Orbax's synchronous `Checkpointer`, which keeps Orbax's atomic finalisation: a checkpoint is
written under `<name>.orbax-checkpoint-tmp-<n>` and renamed to `<name>` once complete.

Faults: a save that fails on the thread is kept until `raise_failure()` (the checkpoint callbacks
call it at every step) raises it as `SaveFailed`, after running the `on_failure` given with that
save, which undoes what the save promised (best and last paths); a deletion that fails is a
warning there (the checkpoint stays). Nothing a save or deletion raises ends the thread. Old
checkpoints are deleted by renaming them to a temporary name first (atomic), then removing the
files: a kill half-way leaves a folder `cleanup()` recognises, never a half-deleted checkpoint
under its real name (on a store: `fitjax._storage.remove`'s order). Waits for the thread are
bounded by the store's (`fitjax._storage.store_timeout`), and after SIGTERM (`signalled`) a wait
on a store operation that has not answered for `SIGNAL_GRACE` seconds ends with `SaveFailed`. A state that
is not fully addressable from this process (several processes) is handed to Orbax's
`AsyncCheckpointer` on the caller's thread, after the queue is drained (one Orbax save at a time),
which copies this process's shards to the host before returning; for a store URL each process
stages and uploads its part, and process 0 commits once all are up (`_save_shards`).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import os
import queue
import shutil
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable

import jax
import numpy as np

from fitjax import _stack, _storage
from fitjax.checkpoint import _format, _save_errors
from fitjax.checkpoint._format import SaveFailed
from fitjax.step import xla_cpu
from fitjax.strategies import bytes_per_device, peak_bytes
from fitjax._lazy import LazyModule

ocp = LazyModule("orbax.checkpoint")  # imported at the first save

__all__ = ["CheckpointWriter", "cleanup", "import_orbax_soon", "is_donated", "prepare", "writer"]

_DELETING = _format.TMP_MARK + "-deleting"  # an old checkpoint on its way out
SIGNAL_GRACE = 5.0  # seconds a store operation may go unanswered after SIGTERM before the wait ends
REPORTS_AFTER = 30.0  # seconds after a failed save that Orbax's and tensorstore's reports are its
log = logging.getLogger("fitjax")


class CheckpointWriter:
    """Writes `(state, meta)` checkpoints one at a time, in the order they were asked for, on a
    thread of its own. Use the process's one writer, `writer()`: a second one would run Orbax
    saves at the same time as the first's."""

    def __init__(self, copy_on_device: bool | None = None) -> None:
        # None: where the platform calls for it (`xla_cpu.saves_copy_on_device`) and the devices
        # have room for the copy (`_room_for_copy`); True, False: always, never
        self.copy_on_device = copy_on_device
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._worker: threading.Thread | None = None  # started at the first save, lives on
        self._idle = threading.Condition()
        self._queued: dict[str, int] = {}  # paths queued or being written -> how many times
        self._failures: list[tuple[str, BaseException, Callable[[], None] | None]] = []
        self._failed_at = -float("inf")  # time.monotonic() of the last failure (`_reporting`)
        self._undeleted: list[tuple[str, BaseException]] = []  # deletions that failed: warned about
        self._signal: str | None = None  # a stop signal received during this fit (`signalled`)
        self._host: tuple[Any, _HostCopy, dict[str, str]] | None = None  # (state, its copy, key impls)
        self._sharded_saves = 0  # multi-process saves so far: names their barriers (same on every process)
        self.write_cpu_seconds = 0.0  # CPU time the writer's thread spent on finished writes (`_work`)
        # wall time of finished writes' transfers of copies made on the device, less their CPU time
        # (in `write_cpu_seconds` already): a TPU's steps run slower while its copy moves
        self.transfer_seconds = 0.0

    # ------------------------------------------------------------------------------ saving

    def save(self, path: str | os.PathLike, state: Any, meta: dict[str, Any], *,
             delete: Iterable[str | os.PathLike] = (), on_failure: Callable[[], None] | None = None
             ) -> Path:
        """Queues checkpoint `path` (written, then the checkpoints in `delete` removed).

        A save of the state the queued saves hold returns at once; a save of another state
        first waits for them (and raises a failure among them). `on_failure` runs on the
        caller's thread when this save's failure is raised.
        """
        path = _storage.as_path(path)
        if is_donated(state):  # a step interrupted after taking the state: only it had the new one
            raise SaveFailed(f"ModelCheckpoint cannot save {str(path)!r}: the train state's buffers were "
                             "handed to a step that did not return (interrupted twice?); the checkpoints "
                             "before it stay.")
        if self._host is None or self._host[0] is not state:
            self.wait()  # a newer state: the older copies are written first, then dropped
            self._host = None
        directory = path.parent
        if not _storage.is_url(path):
            with contextlib.suppress(OSError):  # deleted during the fit: made again (Lightning does)
                directory.mkdir(parents=True, exist_ok=True)
            if not (directory.is_dir() and os.access(directory, os.W_OK)):
                # a folder made read-only mid-run: say so now
                raise SaveFailed(f"ModelCheckpoint cannot write {str(path)!r}: the folder is not "
                                 "writable (any more).")
        meta = {**meta, "saved_at": time.time()}
        if all(getattr(x, "is_fully_addressable", True) for x in jax.tree.leaves(state)):
            if self._host is None:  # the step donates the state's buffers: the thread owns a copy
                tree, impls = _format.saveable_tree(state)
                self._host = (state, _HostCopy(tree, self._copies_on_device(tree)), impls)
            write = functools.partial(_write_copy, path, self._host[1], self._host[2], meta)
        else:
            self.wait()  # Orbax's multi-process save starts here, on this thread: alone
            write = _save_shards(path, _format.save_args(state, meta), self._sharded_saves)
            self._sharded_saves += 1

        doomed = [_storage.as_path(old) for old in delete if str(_storage.as_path(old)) != str(path)]
        with self._idle:
            self._queued[str(path)] = self._queued.get(str(path), 0) + 1
        if self._worker is None:  # one thread for the process: starting one per save costs ~10 ms
            _save_errors.route_orbax_reports(self._reporting)
            self._worker = threading.Thread(target=self._work, name="fitjax-checkpoint", daemon=True)
            self._worker.start()
        self._jobs.put((path, write, doomed, on_failure))
        return path

    def _copies_on_device(self, tree: Any) -> bool:
        if self.copy_on_device is not None:
            return self.copy_on_device
        arrays = [x for x in jax.tree.leaves(tree) if isinstance(x, jax.Array)]
        devices = {d for x in arrays for d in x.sharding.device_set}
        platforms = {d.platform for d in devices}
        return (len(platforms) == 1 and xla_cpu.saves_copy_on_device(platforms.pop())
                and _room_for_copy(bytes_per_device(arrays), [d.memory_stats() for d in devices]))

    def busy(self) -> bool:
        """True while any save is queued or being written."""
        with self._idle:
            return bool(self._queued)

    def _reporting(self) -> bool:
        """Whether what Orbax's threads report now is about this writer's saves: one is queued or
        being written, or one failed in the last `REPORTS_AFTER` seconds (tensorstore's last
        callbacks land after the failure is raised)."""
        return bool(self._queued) or time.monotonic() - self._failed_at < REPORTS_AFTER

    def is_queued(self, path: str | os.PathLike) -> bool:
        """True while a save to `path` is queued or being written (its folder not there yet)."""
        with self._idle:
            return str(_storage.as_path(path)) in self._queued

    def _work(self) -> None:
        while True:
            path, write, doomed, on_failure = self._jobs.get()
            started = time.thread_time()  # this thread's own CPU: the Python of a write holds the GIL
            moved = 0.0
            try:
                moved = write() or 0.0
            except BaseException as error:  # noqa: BLE001 - reported on the loop's thread
                with self._idle:
                    self._failures.append((str(path), error, on_failure))
                    self._failed_at = time.monotonic()
            else:
                for old in doomed if jax.process_index() == 0 else ():
                    try:
                        _delete(old)
                    except BaseException as error:  # noqa: BLE001 - a warning on the loop's thread
                        with self._idle:
                            self._undeleted.append((str(old), error))
            finally:
                with self._idle:
                    self.write_cpu_seconds += time.thread_time() - started
                    self.transfer_seconds += moved
                    self._queued[str(path)] -= 1
                    if not self._queued[str(path)]:
                        del self._queued[str(path)]
                    self._idle.notify_all()

    # ------------------------------------------------------------------------------ waiting

    def raise_failure(self) -> None:
        """Raises `SaveFailed` if a save failed since the last call (cheap: no waiting), after
        running the `on_failure` of every save that failed."""
        if not self._failures and not self._undeleted:  # asked every step: no lock when nothing
            return  # is waiting (a list the thread appends to now is seen at the next call)
        with self._idle:
            failures, self._failures = self._failures, []
            undeleted, self._undeleted = self._undeleted, []
        for path, error in undeleted:
            warnings.warn(f"ModelCheckpoint could not delete {path!r}, which top-k no longer keeps: "
                          f"{type(error).__name__}: {_first_line(error).rstrip('.')}. It stays; delete it by hand "
                          "if it is not wanted.", stacklevel=_stack.user_stacklevel())
        if not failures:
            return
        for _, _, on_failure in failures:
            if on_failure is not None:
                on_failure()
        path, error, _ = failures[0]
        more = f" ({len(failures) - 1} later saves failed too)" if len(failures) > 1 else ""
        # Orbax's frames and chained errors run to a hundred lines: kept for the debug log
        log.debug("fitjax: the save of %r failed with", path, exc_info=error)
        raise SaveFailed(f"ModelCheckpoint could not save {path!r}: {_save_errors.describe(error, _first_line)}"
                         f"{more}. (Orbax's full report: logging.getLogger('fitjax').setLevel('DEBUG').)") from None

    def wait(self) -> None:
        """Blocks until every queued save is written, then raises a failure among them, if any."""
        self.drain()
        self._host = None  # written: the host copy is not needed any more
        self.raise_failure()

    def drain(self) -> None:
        """Blocks until every queued save is written; failures stay pending for `raise_failure`.

        Polls (Ctrl-C is raised here at once); after `signalled`, a store operation of the thread
        that has not answered for `SIGNAL_GRACE` seconds ends the wait with `SaveFailed`."""
        with self._idle:
            while self._queued:
                try:
                    self._idle.wait(timeout=0.2)
                except KeyboardInterrupt:
                    self._signal = "Ctrl-C"  # the waits of the teardown that follows give up on a stall
                    raise
                if self._signal is not None and self._queued:
                    stalled = [(op, url, time.monotonic() - since) for op, url, since in _storage.in_flight()
                               if time.monotonic() - since > SIGNAL_GRACE]
                    if stalled:
                        op, url, waited = stalled[0]
                        raise SaveFailed(
                            f"{self._signal} received while waiting for the save of "
                            f"{next(iter(self._queued))!r}: {op} of {url!r} has not answered for "
                            f"{waited:.0f} s; that save is not complete (the checkpoints before it stay).")

    def signalled(self, reason: str | None) -> None:
        """Records a stop signal (`"SIGTERM"`) the loop received, or None at a fit's start: from
        then on a wait gives up on a stalled store (`drain`). Safe in a signal handler."""
        self._signal = reason


_WRITER = CheckpointWriter()


COPY_HEADROOM = 0.1  # of the device's memory kept free beside a save's copy on the device


def _room_for_copy(needed: int, stats: list[dict[str, int] | None]) -> bool:
    """Whether every device has `needed` bytes free beside the largest peak seen so far
    (`fitjax.strategies.peak_bytes`; the bytes in use where no peak is reported), keeping
    `COPY_HEADROOM` of its memory free; no where a device does not report its memory."""
    for stat in stats:
        if not stat or "bytes_limit" not in stat:
            return False
        peak = peak_bytes(stat)
        if peak is None:
            peak = stat.get("bytes_in_use", 0) + stat.get("peak_bytes_reserved", 0)
        if peak + needed > (1 - COPY_HEADROOM) * stat["bytes_limit"]:
            return False
    return True


class _HostCopy:
    """The state's copy that the saves of one step share, in host memory when first written.

    Made on the loop's thread in one of two ways. On the host: `device_get`, the loop waiting for
    the transfer (a TPU v5e chip sat idle 383 ms for GPT-2 small's 1.42 GiB). Or on the device
    (`on_device`): a copy within the devices' memory, a few milliseconds there, which the writer's
    thread brings to the host while the loop goes on; the step donates the state's own buffers,
    never the copy's, and the copy is dropped once on the host."""

    def __init__(self, tree: Any, on_device: bool):
        self.on_device = on_device
        self._lock = threading.Lock()
        if on_device:
            leaves, treedef = jax.tree.flatten(tree)
            arrays = [i for i, x in enumerate(leaves) if isinstance(x, jax.Array)]
            copies = jax.device_put([leaves[i] for i in arrays], [leaves[i].sharding for i in arrays],
                                    may_alias=False)
            for i, copy in zip(arrays, copies):
                leaves[i] = copy
            self._tree, self._host = jax.tree.unflatten(treedef, leaves), None
        else:
            self._tree, self._host = None, jax.tree.map(_owned, jax.device_get(tree))

    def host(self) -> tuple[Any, float]:
        """The copy in host memory, and the seconds this call spent moving it there beyond its
        CPU time (on the writer's thread: the first save to write it makes the transfer; the
        others find it made, 0.0). The clock starts once the copy is made on the device, which
        waits for the steps queued before it: their time is the loop's, not the save's."""
        with self._lock:
            if self._host is not None:
                return self._host, 0.0
            jax.block_until_ready(self._tree)
            wall, cpu = time.perf_counter(), time.thread_time()
            self._host, self._tree = jax.tree.map(_owned, jax.device_get(self._tree)), None
            return self._host, max(0.0, time.perf_counter() - wall - (time.thread_time() - cpu))


class _Owned(np.ndarray):
    """A host copy that only the writer holds and nothing changes: Orbax deep-copies each numpy
    array before writing it (against a caller changing it meanwhile; its `NumpyHandler` option
    `deepcopy_host_arrays=False` is not reachable through `StandardSave`), which would hold the
    state's size twice in host memory and copy it on the writer's thread: 0.3-1.2 s of CPU and
    ~0.5 s of the write's time per 512 MiB on this project's 2-core machine."""

    def __deepcopy__(self, memo: dict) -> _Owned:
        return self


def _owned(leaf: Any) -> Any:
    return leaf.view(_Owned) if type(leaf) is np.ndarray else leaf


def is_donated(state: Any) -> bool:
    """True when `state`'s buffers were donated to a step (the train step takes them) that has
    not returned the new ones: nothing of it can be read any more."""
    return state is not None and any(getattr(x, "is_deleted", bool)() for x in jax.tree.leaves(state))


def import_orbax_soon() -> None:
    """Starts importing Orbax (~0.1 s, more with a cold disk) on a thread, for a fit that will
    save: called as its train step is about to compile, the first save then finds it imported."""
    ocp.import_soon()


def writer() -> CheckpointWriter:
    """The process's checkpoint writer, which every save goes through."""
    return _WRITER


@atexit.register
def _finish_saves() -> None:
    # The thread is a daemon (a hung store must not hang the interpreter's exit), so a save
    # still queued when the program ends is finished here rather than lost (a wait bounded by
    # the store's timeout, or ended by a stall after a stop signal).
    try:
        _WRITER.drain()
    except SaveFailed as error:
        log.warning("fitjax: %s", error)


# ------------------------------------------------------------------------------ folders

def _write_copy(path: _storage.AnyPath, copy: _HostCopy, impls: dict[str, str], meta: dict[str, Any]) -> float:
    """Writes the copy's checkpoint; returns the seconds its transfer to the host took (`_HostCopy.host`)."""
    tree, moved = copy.host()
    _write(path, _format.composite_args(tree, impls, meta))
    return moved


def _write(path: _storage.AnyPath, args: Any) -> None:
    """Orbax's synchronous save of `args` as checkpoint `path`; for a store URL, into a local
    staging folder first, then uploaded (see `fitjax._storage`)."""
    if not _storage.is_url(path):
        ocp.Checkpointer(ocp.CompositeCheckpointHandler()).save(path, args=args)
        return
    stage = _storage.temp_folder("stage")
    try:
        ocp.Checkpointer(ocp.CompositeCheckpointHandler()).save(stage / path.name, args=args)
        _storage.upload(stage / path.name, path)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _save_shards(path: _storage.AnyPath, args: Any, number: int) -> Callable[[], None]:
    """Starts Orbax's multi-process save of `args` (this process's shards copied to the host
    before it returns); returns what finishes it, to run on the writer's thread.

    On a store URL every process stages its part in a local folder of its own, as Orbax does for
    hosts without a shared disk (`primary_host=None`: each process creates, writes and renames
    its own folder; zarr, one file per chunk, rather than OCDBT, whose manifests process 0 would
    merge from every process's files), uploads it, and waits for the others at a barrier;
    process 0 then writes `_storage.COMPLETE` last. The union of the parts is the whole checkpoint (every
    part holds the same metadata and the chunks of the shards its process writes).
    """
    if not _storage.is_url(path):
        saver = ocp.AsyncCheckpointer(ocp.CompositeCheckpointHandler())
        saver.save(path, args=args)

        def finish() -> None:
            saver.wait_until_finished()
            saver.close()

        return finish
    _quiet_orbax_staging()
    stage = _storage.temp_folder("stage")
    local = ocp.options.MultiprocessingOptions(primary_host=None)  # each process its own folder and rename
    # folders made before the save returns (local mkdirs): made in the background, the
    # checkpoint's folder and its items' folders race (each process makes both here)
    made_now = ocp.options.AsyncOptions(create_directories_asynchronously=False)
    handler = ocp.CompositeCheckpointHandler(
        **{_format.STATE_ITEM: ocp.StandardCheckpointHandler(use_ocdbt=False, multiprocessing_options=local),
           _format.META_ITEM: ocp.JsonCheckpointHandler(multiprocessing_options=local)},
        composite_options=ocp.CompositeOptions(multiprocessing_options=local, async_options=made_now))
    saver = ocp.AsyncCheckpointer(handler, async_options=made_now, multiprocessing_options=local)
    saver.save(stage / path.name, args=args)

    def finish() -> None:
        try:
            saver.wait_until_finished()
            saver.close()
            _storage.begin(path)  # every process: the prefix is fitjax's before any part of it lands
            _storage.put_folder(stage / path.name, path)  # this process's chunks, and the metadata
            # barriers of the distributed client, safe on this thread (no device collective)
            barrier = ocp.multihost.get_barrier_sync_fn()
            barrier(key=f"fitjax-uploaded-{number}", timeout_ms=600_000)
            if jax.process_index() == 0:
                _storage.commit(path)  # last, listing every process's part, all on the store now
            # and no process counts the save done (a resume lists the store) before it is committed
            barrier(key=f"fitjax-committed-{number}", timeout_ms=600_000)
        finally:
            shutil.rmtree(stage, ignore_errors=True)

    return finish


class _StagingNotes(logging.Filter):
    """Drops the two warnings Orbax logs at every save of this layout, per process ("Global
    object size logging disabled for `primary_host=None`", "Skipping merge of OCDBT
    checkpoints"): they describe the choice made, not a problem."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        return "primary_host=None" not in text and "Skipping merge of OCDBT" not in text


def _quiet_orbax_staging() -> None:
    absl = logging.getLogger("absl")
    if not any(isinstance(f, _StagingNotes) for f in absl.filters):
        absl.addFilter(_StagingNotes())


PROBE = ".fitjax-write-probe-"  # `prepare`'s object, `<PROBE><pid>-<process index>`


def prepare(directory: _storage.AnyPath) -> None:
    """Creates `directory` and proves it writable (on a store: a probe object written and
    removed, each request retried as a save's are): an error before the first step, rather than
    at the first save. The probe is removed on every path; one a kill left goes at the next
    start (`cleanup`)."""
    probe = directory / f"{PROBE}{os.getpid()}-{jax.process_index()}"
    if _storage.is_url(directory):
        try:
            try:
                _storage.put_bytes(probe, b"")
            finally:
                _storage.delete(probe)
        except Exception as error:  # noqa: BLE001 - botocore, gcsfs and fsspec raise many kinds
            raise PermissionError(f"ModelCheckpoint cannot write checkpoints to "
                                  f"{_storage.store_error(str(directory), error)}") from None
        return
    try:
        directory.mkdir(parents=True, exist_ok=True)
        try:
            probe.write_bytes(b"")
        finally:
            probe.unlink(missing_ok=True)
    except OSError as error:
        raise PermissionError(
            f"ModelCheckpoint cannot write checkpoints to {str(directory)!r}: {error}. "
            "Pass a writable ModelCheckpoint(dirpath=...) or Trainer(default_root_dir=...)."
        ) from None


def cleanup(directory: Path) -> list[Path]:
    """Removes what interrupted saves and deletions left in `directory`, on process 0, once this
    process's queued saves are written (one in flight looks the same), and nothing else: on disk
    Orbax's temporary folders (`*.orbax-checkpoint-tmp*`), on a store the folders fitjax began
    uploading or deleting a checkpoint in and did not finish (`_storage.is_partial`), each named
    in a log line, and on both the write probes of other processes (`prepare`, killed between
    its two requests). Call it when a run starts, holding the folder's lease
    (`hold_folder`): no other fit is saving there, so every such leftover is abandoned."""
    _WRITER.drain()
    if jax.process_index() != 0:
        return []
    on_store = _storage.is_url(directory)
    names = _storage.names(directory) if on_store else (
        sorted(p.name for p in directory.iterdir()) if directory.is_dir() else [])
    removed = []
    for name in names:
        path = directory / name
        if name.startswith(PROBE):
            if name.startswith(f"{PROBE}{os.getpid()}-"):
                continue  # this process's, being written now by another of its callbacks
            log.info("fitjax: removing %s, the write probe of a run that was killed", path)
            if on_store:
                _storage.delete(path)
            else:
                path.unlink(missing_ok=True)
        elif on_store:
            if _storage.is_partial(path):
                log.warning("fitjax: removing %s, a checkpoint whose upload or deletion was interrupted "
                            "(%s missing)", path, _storage.COMPLETE)
                _storage.remove(path)
                removed.append(path)
        elif _format.TMP_MARK in name and path.is_dir():
            log.warning("fitjax: removing %s, what an interrupted save or deletion left", path)
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _delete(path: Path) -> None:
    """Renames `path` out of the way (atomic), then removes its files; on a store, removes its
    commit marker first, then its files."""
    if _storage.is_url(path):
        _storage.remove(path)
        return
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
