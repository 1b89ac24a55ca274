"""Which fit is writing checkpoints into a folder now: one lease per fit and folder.

A fit's `ModelCheckpoint` takes a lease on its folder at fit start: the object
`.fitjax-lease-<host>-<pid>` (JSON: host, pid, command line, start time, heartbeat), rewritten
every `BEAT` seconds on a thread of its own while the fit runs, and removed when it ends. Another
fit starting on the same folder finds it and is refused, naming the running fit: two fits saving
into one folder would race for the same checkpoint names, and the second's start-up clean-up
would take the first's saves in progress for a killed run's leftovers. A lease is dead, and
removed, when its process is gone (same host: `kill(pid, 0)`), or, whatever the pid, when its
heartbeat is older than `stale_after()` (a fit killed with SIGKILL on another machine holds its
folder that long; on this machine a pid reused by another process would hold it for ever). A
heartbeat stamped in the future is another machine's clock running ahead of this one's: it counts
as heard now while it is less than `stale_after()` ahead, then as stale, and is named in the
messages. Costs: one small write per `BEAT` (30 s) on a store; nothing on the loop.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import socket
import sys
import threading
import time
from typing import Any

from fitjax import _storage

__all__ = ["BEAT", "FolderInUse", "PREFIX", "holder", "release", "stale_after", "take"]

PREFIX = ".fitjax-lease-"
BEAT = 30.0  # seconds between heartbeats
log = logging.getLogger("fitjax")


class FolderInUse(RuntimeError):
    """Another fit, running now, writes checkpoints into the folder."""


def stale_after() -> float:
    """Seconds without a heartbeat after which another host's lease is dead: four beats and the
    store's timeout (`FITJAX_STORE_TIMEOUT`), so a store slow to take a beat costs no lease."""
    return 4 * BEAT + _storage.store_timeout()


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname()) or "host"


@dataclasses.dataclass
class _Lease:
    path: Any
    record: dict[str, Any]
    users: int = 1
    stop: threading.Event = dataclasses.field(default_factory=threading.Event)
    writing: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def write(self) -> None:
        self.record["beat"] = time.time()
        data = json.dumps(self.record).encode()
        if _storage.is_url(self.path):
            _storage.put_bytes(self.path, data)
        else:  # whole or not at all: a reader never sees half a record
            part = self.path.with_name(f"{self.path.name}.part")
            part.write_bytes(data)
            os.replace(part, self.path)

    def beat(self) -> None:
        while not self.stop.wait(BEAT):
            with self.writing:  # never after `release` removed the lease: it would outlive the fit
                if self.stop.is_set():
                    return
                try:
                    self.write()
                except Exception as error:  # noqa: BLE001 - a store down for a while: the next beat retries
                    log.debug("fitjax: heartbeat of %s failed: %s", self.path, error)


_HELD: dict[str, _Lease] = {}  # folder -> this process's lease there (several callbacks share it)
_LOCK = threading.Lock()


def take(directory: _storage.AnyPath) -> None:
    """Takes this process's lease on `directory` (shared by its callbacks on that folder), or
    raises `FolderInUse` naming the fit that holds one. Two fits starting at the same moment
    both write theirs first, then read: the one started later (ties: by name) is refused."""
    key = str(directory)
    with _LOCK:
        if key in _HELD:
            _HELD[key].users += 1
            return
    lease = _Lease(directory / f"{PREFIX}{_host()}-{os.getpid()}",
                   {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time(),
                    "command": " ".join(sys.argv)[:300]})
    lease.write()
    other = holder(directory, mine=lease)
    if other is not None:
        _remove(lease.path)
        raise FolderInUse(_in_use(directory, other))
    with _LOCK:
        _HELD[key] = lease
    threading.Thread(target=lease.beat, name="fitjax-lease", daemon=True).start()


def release(directory: _storage.AnyPath) -> None:
    """Gives back this process's lease on `directory` once its last user is done."""
    with _LOCK:
        lease = _HELD.get(str(directory))
        if lease is None:
            return
        lease.users -= 1
        if lease.users:
            return
        del _HELD[str(directory)]
    with lease.writing:
        lease.stop.set()
    try:
        _remove(lease.path)
    except Exception as error:  # noqa: BLE001 - dead once its process ends: the next start removes it
        log.warning("fitjax: could not remove the lease %s: %s", lease.path, error)


def holder(directory: _storage.AnyPath, mine: _Lease | None = None) -> dict[str, Any] | None:
    """The record of the live lease on `directory` that wins over `mine` (another process's,
    started earlier), or None; dead leases found on the way are removed and logged."""
    found = []
    for name in _names(directory):
        if not name.startswith(PREFIX) or name.endswith(".part") or (mine is not None and name == mine.path.name):
            continue
        path = directory / name
        record = _read(path)
        if record is None:
            continue  # removed since the listing
        dead = _dead(record)
        if dead:
            log.warning("fitjax: removing %s, the lease of a fit that is gone (pid %s on %s): %s", path,
                        record.get("pid"), record.get("host"), dead)
            _remove(path)
            continue
        found.append((float(record.get("started", 0)), name, record))
    if mine is not None:
        ours = (mine.record["started"], mine.path.name)
        found = [f for f in found if (f[0], f[1]) < ours]
    return min(found, key=lambda f: (f[0], f[1]))[2] if found else None


def _age(record: dict[str, Any]) -> float:
    """Seconds since the lease's last heartbeat by this machine's clock (below 0: stamped ahead)."""
    try:
        return time.time() - float(record.get("beat") or 0)
    except (TypeError, ValueError):
        return float("inf")


def _dead(record: dict[str, Any]) -> str:
    """Why the lease `record` is dead, or "" while it is live."""
    pid, host = record.get("pid"), record.get("host")
    if not isinstance(pid, int) or not isinstance(host, str):
        return "not a lease fitjax wrote"
    age, limit = _age(record), stale_after()
    if age >= limit:  # whatever the pid: on this machine another process may have taken it
        return f"no heartbeat for {age:.0f} s (a lease is stale after {limit:.0f} s)"
    if -age >= limit:
        return (f"its heartbeat is stamped {-age:.0f} s in the future: the clock of {host} and this machine's "
                f"disagree (clock skew), and a heartbeat over {limit:.0f} s ahead is taken as stale")
    if host == socket.gethostname() and not _storage.process_alive(pid):
        return "its process is gone"
    return ""


def _in_use(directory: _storage.AnyPath, record: dict[str, Any]) -> str:
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(record.get("started", 0))))
    age, limit = _age(record), stale_after()
    heard = (f"last heard from {age:.0f} s ago" if age >= -1 else
             f"its last heartbeat stamped {-age:.0f} s in the future (the clock of {record.get('host')} runs ahead "
             "of this machine's: clock skew)")
    # stale at beat + limit by this clock: a heartbeat from the future waits its lead too
    free = max(limit - age, 0)
    return (f"ModelCheckpoint's folder {str(directory)!r} is in use by another fit running now: pid "
            f"{record.get('pid')} on {record.get('host')}, started {started} (`{record.get('command', '')}`), "
            f"{heard}. Two fits saving into one folder would race for its checkpoint names and clean up each "
            "other's saves in progress. Give this fit its own folder (ModelCheckpoint(dirpath=...), or a logger "
            "version of its own), or wait for that fit to end. If it was killed, the folder is free in "
            f"{free:.0f} s, at {time.strftime('%H:%M:%S', time.localtime(time.time() + free))}, {limit:.0f} s "
            "after its last heartbeat (at once on its own machine when its process is gone).")


def _names(directory: _storage.AnyPath) -> list[str]:
    if _storage.is_url(directory):
        return _storage.names(directory)
    try:
        return sorted(p.name for p in directory.iterdir())
    except FileNotFoundError:
        return []


def _read(path: _storage.AnyPath) -> dict[str, Any] | None:
    try:
        data = _storage.get_bytes(path) if _storage.is_url(path) else path.read_bytes()
    except FileNotFoundError:
        return None
    if data is None:
        return None
    try:
        record = json.loads(data)
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


def _remove(path: _storage.AnyPath) -> None:
    if _storage.is_url(path):
        _storage.delete(path)
    else:
        path.unlink(missing_ok=True)
