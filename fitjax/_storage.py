"""Where files go: local folders, or object-store URLs (`s3://bucket/run`, `gs://bucket/run`).

Every path argument goes through `as_path`: a local path becomes an absolute `pathlib.Path`
(`~` expanded), a URL an `etils.epath.Path`, which Orbax brings and which reaches the store
through fsspec (`s3fs` for `s3://`, `gcsfs` for `gs://`): the one file layer for small files.

Checkpoints on a store. Orbax (0.12) writes arrays to local folders and `gs://` only, and a store
has no atomic rename, so a checkpoint for a URL is written by Orbax into a local staging folder
on the writer's thread, then uploaded file by file between two objects of fitjax's own:
`.fitjax-checkpoint` first (this prefix is fitjax's: only such a prefix is ever deleted) and
`.fitjax-complete` last, which lists every file and its size. Every reader and lister counts a
checkpoint on a store complete only once `.fitjax-complete` is there (Orbax's own
`commit_success.txt` is uploaded early, in sorted order, so it proves nothing). Deleting one
removes `.fitjax-complete` first and `.fitjax-checkpoint` last: a kill at any object leaves either
a complete checkpoint or a prefix the next writer recognises as its own and removes. Reading one
downloads the listed files once into a per-process cache, sizes checked, its own copy of the
marker written last: an interrupted download is never trusted. The record itself is checked
whole first (`_safe_names.check_record`): no name it holds can land outside the cache.

Waits on a store are bounded: every request has `store_timeout()` seconds to answer (connect and
read), one attempt each (s3fs/botocore's and gcsfs's own retry loops, which would multiply the
bound, are turned off for the filesystems fitjax and epath use), and fitjax's operations retry
transient failures (refused or dropped connections, timeouts, 5xx) with back-off until that much
time has passed since their first try, then raise `StoreTimeout` naming the URL and the operation.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import re
import shutil
import tempfile
import threading
import time
import types
import uuid
from pathlib import Path
from typing import Any, Callable, TypeVar, Union

from etils import epath

from fitjax import _safe_names

__all__ = ["AnyPath", "CLAIM", "COMPLETE", "StoreTimeout", "as_path", "begin", "commit", "create_new", "delete",
           "download", "folder", "get_bytes", "in_flight", "is_partial", "is_url", "names", "process_alive",
           "put_bytes", "put_file", "put_folder", "remove", "retried", "store_error", "store_timeout", "temp_folder",
           "upload"]

AnyPath = Union[Path, epath.Path]
CLAIM = ".fitjax-checkpoint"  # the first object of a checkpoint's upload: this prefix is fitjax's
COMPLETE = ".fitjax-complete"  # the last: the checkpoint's file list; without it, incomplete
TIMEOUT_VAR = "FITJAX_STORE_TIMEOUT"
_URL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")
_CACHE: Path | None = None
_T = TypeVar("_T")
log = logging.getLogger("fitjax")


class StoreTimeout(TimeoutError):
    """A store that did not answer, or kept failing, for `store_timeout()` seconds."""


def is_url(path: str | os.PathLike) -> bool:
    """True for `s3://...`, `gs://...` and other URLs."""
    return bool(_URL.match(os.fspath(path)))


def as_path(path: str | os.PathLike) -> AnyPath:
    """A URL as an `epath.Path`; a local path with `~` expanded, made absolute (Orbax takes
    absolute paths only, and later working directories must not matter)."""
    text = os.fspath(path)
    if is_url(text):
        _bound_requests()
        if text.startswith(("gs://", "gcs://")):
            with contextlib.suppress(ImportError):  # gcsfs missing: said at the first request (`_fs`)
                _one_attempt(epath.backend.fsspec_backend.fs(text))  # the instance epath reads with
        return epath.Path(text)
    return Path(os.path.abspath(os.path.expanduser(text)))


def folder(path: str | os.PathLike) -> AnyPath:
    """A URL as an `epath.Path`; a local path as a `pathlib.Path`, as given (a relative one stays
    relative, unlike `as_path`)."""
    return as_path(path) if is_url(path) else Path(path)


# ------------------------------------------------------------------------------ bounded waits

def store_timeout() -> float:
    """Seconds a store request may go unanswered, and an operation may keep failing, before it
    is an error: `FITJAX_STORE_TIMEOUT` (default 60)."""
    text = os.environ.get(TIMEOUT_VAR, "60")
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(f"{TIMEOUT_VAR} must be a number of seconds above 0; got {text!r}. "
                         f"Set it like {TIMEOUT_VAR}=120, or unset it for the default (60).")
    return value


_BOUND: dict[str, Any] = {}  # the request bounds set in fsspec's configuration, to update them


def _bound_requests() -> None:
    """Makes every request of fsspec's s3 and gs filesystems (those `epath` and fitjax use) give
    up after `store_timeout()` seconds without an answer (connecting, or between two reads: a
    large file may take longer as long as it flows), one attempt each (fitjax's operations retry,
    `retried`), and list afresh each time, by fsspec's per-protocol defaults; values a user set there
    are kept. A changed timeout or `AWS_ENDPOINT_URL` takes effect at the next URL (gcsfs reads
    `STORAGE_EMULATOR_HOST` at each request)."""
    timeout = store_timeout()
    endpoint = os.environ.get("AWS_ENDPOINT_URL")
    if _BOUND.get("read_timeout") == timeout and _BOUND.get("endpoint") == endpoint:
        return
    import fsspec.config  # noqa: PLC0415 - only for stores

    conf = fsspec.config.conf.setdefault("s3", {})
    mine = {"connect_timeout": timeout, "read_timeout": timeout,
            "retries": {"total_max_attempts": 1, "mode": "standard"}}
    kwargs = conf.setdefault("config_kwargs", {})
    for key, value in mine.items():
        if key not in kwargs or kwargs[key] == _BOUND.get(key):
            kwargs[key] = value
    # gcsfs: `requests_timeout` goes to aiohttp (a socket that connects or reads nothing for that
    # long ends the request), `retry_timeout` bounds the bucket-type lookup of gcsfs's default
    # class (a gRPC call retried for 60 s by default); its HTTP retries are turned off per instance
    gs_conf = fsspec.config.conf.setdefault("gs", {})
    with contextlib.suppress(ImportError):  # aiohttp comes with gcsfs
        import aiohttp  # noqa: PLC0415 - only for gs://

        for key, value in {"requests_timeout": aiohttp.ClientTimeout(sock_connect=timeout, sock_read=timeout),
                           "retry_timeout": timeout}.items():
            if key not in gs_conf or gs_conf[key] == _BOUND.get(f"gs {key}"):
                gs_conf[key] = value
                _BOUND[f"gs {key}"] = value
    if "endpoint" in _BOUND:  # settings changed since the filesystems were made: made again
        _forget_filesystems()
    # s3fs and gcsfs keep every listing forever by default: another process's saves, or a
    # deletion, would stay unseen ("last" resuming from an older checkpoint)
    conf.setdefault("use_listings_cache", False)
    gs_conf.setdefault("use_listings_cache", False)
    _BOUND.update(mine, endpoint=endpoint)


def _forget_filesystems() -> None:
    """Drops fsspec's and epath's s3 and gs filesystems (each keeps the first it made, with the
    settings of then), so the next request uses the current timeout and endpoint."""
    import fsspec  # noqa: PLC0415 - only for stores

    for protocol in ("s3", "gs"):
        with contextlib.suppress(ImportError, ValueError):
            fsspec.get_filesystem_class(protocol).clear_instance_cache()
    cached = getattr(getattr(epath.backend, "_FileSystemSpecBackend", None), "_get_filesystem", None)
    if hasattr(cached, "cache_clear"):
        cached.cache_clear()


_FLIGHT: dict[int, tuple[str, str, float]] = {}  # thread -> (operation, URL, since when)
_TRANSIENT = {"TimeoutError", "ConnectionError", "EndpointConnectionError", "ConnectTimeoutError",
              "ReadTimeoutError", "ConnectionClosedError", "HTTPClientError", "ServerDisconnectedError",
              "ClientConnectorError", "ClientOSError", "ClientPayloadError", "IncompleteRead",
              "ResponseParserError", "FSTimeoutError", "ProxyConnectionError"}
_TRANSIENT_HTTP = {408, 429, 500, 502, 503, 504}  # gcsfs's HttpError.code
_TRANSIENT_CODES = ("SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout", "503 ", "500 ",
                    "(503)", "(500)")


def _transient(error: BaseException) -> bool:
    """A failure worth retrying: the network or the store's momentary state, not the request."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, StoreTimeout):  # an inner operation's bound already spent: not again
            return False
        if isinstance(error, (FileNotFoundError, FileExistsError, PermissionError, NotImplementedError)):
            return False
        if {c.__name__ for c in type(error).__mro__} & _TRANSIENT or any(
                code in str(error) for code in _TRANSIENT_CODES) or getattr(error, "code", None) in _TRANSIENT_HTTP:
            return True
        error = error.__cause__ or error.__context__
    return False


def retried(operation: str, url: str, call: Callable[[], _T]) -> _T:
    """`call()`, retried with back-off (0.25 s doubling to 8 s) while it fails transiently and
    `store_timeout()` has not passed since the first try; then `StoreTimeout` naming `url` and
    `operation`."""
    timeout, start, delay, tries = store_timeout(), time.monotonic(), 0.25, 0
    me = threading.get_ident()
    try:
        while True:
            tries += 1
            _FLIGHT[me] = (operation, url, time.monotonic())
            try:
                return call()
            except Exception as error:  # noqa: BLE001 - botocore, aiohttp and s3fs raise many kinds
                if not _transient(error):
                    raise
                if time.monotonic() - start + delay > timeout:
                    raise StoreTimeout(
                        f"{url!r}: {operation} did not complete within {timeout:g} s, the store unreachable "
                        f"or stalled ({tries} tries, the last failing with {type(error).__name__}). Check "
                        f"the network and the endpoint, or allow more time with {TIMEOUT_VAR}=<seconds>."
                    ) from error
                time.sleep(delay)
                delay = min(2 * delay, 8.0)
    finally:
        _FLIGHT.pop(me, None)


def in_flight() -> list[tuple[str, str, float]]:
    """The store operations running now, on any thread: `(operation, URL, try started at)`
    (`time.monotonic()`)."""
    return list(_FLIGHT.values())


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0][:200] if text else type(error).__name__


# ------------------------------------------------------------------------------ files

def _fs(path: AnyPath):
    import fsspec  # noqa: PLC0415 - only for stores

    _bound_requests()
    try:
        fs, root = fsspec.core.url_to_fs(os.fspath(path))
    except ImportError as error:  # s3fs / gcsfs missing
        scheme = os.fspath(path).split("://")[0]
        package = {"s3": "s3fs", "gs": "gcsfs", "gcs": "gcsfs"}.get(scheme, f"the fsspec package for {scheme}://")
        raise ImportError(f"{os.fspath(path)!r} needs {package}: pip install {package} "
                          "(or pip install 'fitjax[stores]').") from error
    if type(fs).__name__ == "S3FileSystem":
        # s3fs retries a timed-out request 5 times itself (a class attribute, no argument sets
        # it): once here, `retried` retries on a clock. The instance is the one epath shares.
        fs.retries = 1
    _one_attempt(fs)
    return fs, root


_GCSFS_RETRIED = ("_request", "_get_file_request", "_get_file_concurrent")


def _one_attempt(fs: Any) -> None:
    """Turns off gcsfs's own retries on the instance `fs`: it tries each request 6 times, sleeping
    1 to 16 s between, fixed when the class is defined (no setting changes it), which would make a
    stalled store's bound 6 timeouts and 31 s more; `retried` retries on a clock instead. Each
    retried method is replaced, on this instance only, by the one it wraps."""
    if not type(fs).__module__.startswith("gcsfs") or getattr(fs, "_fitjax_one_attempt", False):
        return
    for name in _GCSFS_RETRIED:
        inner = getattr(getattr(type(fs), name, None), "__wrapped__", None)
        if inner is not None:
            setattr(fs, name, types.MethodType(inner, fs))
    fs._fitjax_one_attempt = True


def _files(local: Path) -> list[Path]:
    return sorted(p for p in local.rglob("*") if p.is_file())


def upload(local: Path, target: AnyPath) -> None:
    """Copies the checkpoint folder `local` to the store folder `target`: `CLAIM` first, then
    its files, then `COMPLETE` listing them (`begin`, `put_folder`, `commit`)."""
    begin(target)
    commit(target, put_folder(local, target))


def begin(target: AnyPath) -> None:
    """Writes `target/CLAIM`: fitjax is uploading a checkpoint there (call it first)."""
    fs, root = _fs(target)
    retried(f"writing {CLAIM}", os.fspath(target), lambda: fs.pipe_file(f"{root}/{CLAIM}", b"fitjax checkpoint\n"))


def commit(target: AnyPath, files: dict[str, int] | None = None) -> None:
    """Writes `target/COMPLETE`, listing `files` (name -> size; None: what the store holds under
    `target` now, for parts several processes uploaded): the checkpoint is complete (call it last)."""
    fs, root = _fs(target)
    url = os.fspath(target)
    if files is None:
        files = {name: size for name, size in _held(fs, root, url).items() if name not in (CLAIM, COMPLETE)}
    listing = json.dumps({"id": uuid.uuid4().hex, "files": files}, sort_keys=True).encode()
    retried(f"writing {COMPLETE}", url, lambda: fs.pipe_file(f"{root}/{COMPLETE}", listing))


def is_partial(target: AnyPath) -> bool:
    """True for a store folder fitjax began writing (or deleting) a checkpoint in and did not
    finish: `CLAIM` there, `COMPLETE` not."""
    fs, root = _fs(target)
    return retried("listing", os.fspath(target),
                   lambda: fs.exists(f"{root}/{CLAIM}") and not fs.exists(f"{root}/{COMPLETE}"))


def put_folder(local: Path, target: AnyPath) -> dict[str, int]:
    """Copies every file under the local folder `local` to the same place under `target`;
    returns what it copied (name under `target` -> size), as `commit` lists it.

    Then checks, in one listing, that the store holds each file at its size: one held at another
    size is uploaded again, once, then an `OSError` names it, so nothing is marked complete over a
    damaged copy (the GCS emulator's multipart parser took a last CR for a line break)."""
    fs, root = _fs(target)
    url = os.fspath(target)
    files = {file.relative_to(local).as_posix(): file for file in _files(local)}
    sizes = {name: file.stat().st_size for name, file in files.items()}

    def put(name: str) -> None:
        retried(f"uploading {name}", url, lambda: fs.put_file(str(files[name]), f"{root}/{name}"))

    def not_whole() -> dict[str, int | None]:  # name -> the size the store holds (None: none)
        held = _held(fs, root, url)
        return {name: held.get(name) for name, size in sizes.items() if held.get(name) != size}

    for name in files:
        put(name)
    for name in not_whole():
        put(name)
    if wrong := not_whole():
        name, held = next(iter(wrong.items()))
        raise OSError(f"{url}/{name}: the store holds {held} bytes of the {sizes[name]} "
                      f"uploaded, twice ({len(wrong)} file(s) so); it is not marked complete.")
    return sizes


def _held(fs, root: str, url: str) -> dict[str, int]:
    """What the store holds under `root` now (one listing): name under `root` -> size."""
    fs.invalidate_cache(root)
    found = retried("listing", url, lambda: fs.find(root, detail=True))
    return {name[len(root):].lstrip("/"): int(info["size"]) for name, info in found.items()}


def create_new(target: AnyPath, data: bytes = b"") -> bool:
    """Creates the store object `target` only if there is none: True if this call created it,
    False if it existed. The store decides (S3's conditional `PUT` with `If-None-Match: *`, GCS's
    `ifGenerationMatch=0`), so of several processes creating one object at once exactly one gets
    True.

    Raises `NotImplementedError` for a filesystem without exclusive creation.
    """
    fs, root = _fs(target)
    try:
        retried("creating", os.fspath(target), lambda: fs.pipe_file(root, data, mode="create"))
    except FileExistsError:
        return False
    except (TypeError, ValueError) as error:  # a filesystem without mode="create"
        raise NotImplementedError(f"{type(fs).__name__} cannot create {os.fspath(target)!r} exclusively") from error
    except OSError as error:  # s3fs reports S3's 412 Precondition Failed as an OSError
        if "precondition" in str(error).lower() or "412" in str(error):
            return False
        raise
    return True


def get_file(target: AnyPath, local: Path) -> bool:
    """Copies the store file `target` to the local path `local`; False when there is none."""
    fs, root = _fs(target)
    url = os.fspath(target)
    if not retried("listing", url, lambda: fs.exists(root)):
        return False
    retried("downloading", url, lambda: fs.get_file(root, str(local)))
    return True


def put_bytes(target: AnyPath, data: bytes) -> None:
    """Writes the store object `target` (retried, as every request here: `retried`)."""
    fs, root = _fs(target)
    retried("writing", os.fspath(target), lambda: fs.pipe_file(root, data))


def get_bytes(target: AnyPath) -> bytes | None:
    """The store object `target`'s bytes; None when there is none."""
    fs, root = _fs(target)
    with contextlib.suppress(FileNotFoundError):
        return retried("reading", os.fspath(target), lambda: fs.cat_file(root))
    return None


def delete(target: AnyPath) -> None:
    """Deletes the store object `target`, if there."""
    fs, root = _fs(target)
    retried("deleting", os.fspath(target), lambda: _rm_if_there(fs, root))


def names(folder: AnyPath) -> list[str]:
    """The sorted names directly under the store folder `folder` (one listing); [] when none."""
    fs, root = _fs(folder)
    fs.invalidate_cache(root)
    with contextlib.suppress(FileNotFoundError):
        found = retried("listing", os.fspath(folder), lambda: fs.ls(root, detail=False))
        return sorted({path.rstrip("/").rsplit("/", 1)[-1] for path in found} - {""})
    return []


def put_file(local: Path, target: AnyPath) -> None:
    """Copies the local file `local` to the store path `target`."""
    fs, root = _fs(target)
    retried("uploading", os.fspath(target), lambda: fs.put_file(str(local), root))


def remove(target: AnyPath) -> None:
    """Deletes the checkpoint folder `target` from the store: `COMPLETE` first (no reader takes it
    as complete while its files go), `CLAIM` last (until then, its next writer knows it as
    fitjax's and finishes the deletion)."""
    fs, root = _fs(target)
    url = os.fspath(target)
    retried(f"deleting {COMPLETE}", url, lambda: _rm_if_there(fs, f"{root}/{COMPLETE}"))
    fs.invalidate_cache(root)
    rest = [name for name in retried("listing", url, lambda: fs.find(root)) if name != f"{root}/{CLAIM}"]
    if rest:
        retried("deleting", url, lambda: fs.rm(rest))
    retried(f"deleting {CLAIM}", url, lambda: _rm_if_there(fs, f"{root}/{CLAIM}"))
    fs.invalidate_cache(root)


def _rm_if_there(fs, name: str) -> None:
    """Deletes the store object `name`, if there: S3 answers a deletion of a missing object as
    done, GCS with 404 (an interrupted deletion, retried, meets it)."""
    with contextlib.suppress(FileNotFoundError):
        fs.rm_file(name)


def _cache() -> Path:
    global _CACHE
    if _CACHE is None:
        _CACHE = temp_folder("store")
        atexit.register(shutil.rmtree, _CACHE, True)
    return _CACHE


_TEMP = re.compile(r"fitjax-(stage|store|logs)-(\d+)-")
_SWEPT = False


def temp_folder(kind: str) -> Path:
    """A new local folder `fitjax-<kind>-<pid>-*` in the temporary folder ("stage": a store
    save's staging copy, "store": the download cache, "logs": a logger's mirror). The first call of a process removes the
    ones whose process is gone (killed, or ended by `os._exit` before its own cleanup ran)."""
    global _SWEPT
    if not _SWEPT:
        _SWEPT = True
        with contextlib.suppress(OSError):
            for path in Path(tempfile.gettempdir()).iterdir():
                found = _TEMP.match(path.name)
                if found and not process_alive(int(found.group(2))):
                    shutil.rmtree(path, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"fitjax-{kind}-{os.getpid()}-"))


def process_alive(pid: int) -> bool:
    """Whether process `pid` of this machine is running (another user's counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive, and not ours to clean
        return True
    return True


def download(target: AnyPath) -> Path:
    """A local copy of the complete store checkpoint `target` (downloaded once per upload): the
    files its `COMPLETE` lists, each checked for its size, then the copy's own `COMPLETE`.

    The record is checked whole before anything is written (`_safe_names.check_record`): a name that is
    not a relative, normalised path inside the checkpoint, or an `id` not of the form `commit`
    writes, is an `UnsafeName` naming the entry, and nothing is downloaded.

    Raises `FileNotFoundError` naming the file when one is missing or of another size."""
    fs, root = _fs(target)
    url = os.fspath(target)
    raw = retried(f"reading {COMPLETE}", url, lambda: fs.cat_file(f"{root}/{COMPLETE}"))
    upload_id, files = _safe_names.check_record(raw, COMPLETE, target.name, markers=(CLAIM, COMPLETE))
    local = _cache() / upload_id / target.name
    for name in files:  # links in the cache (none fitjax makes) would lead elsewhere: checked too
        _safe_names.check_inside(local / name, _cache(), entry=f"{COMPLETE}'s file {name!r}")
    if (local / COMPLETE).is_file():
        return local
    for name, size in sorted(files.items()):
        file = local / name
        file.parent.mkdir(parents=True, exist_ok=True)
        retried(f"downloading {name}", url, lambda: fs.get_file(f"{root}/{name}", str(file)))
        if file.stat().st_size != size:
            raise FileNotFoundError(f"{url}/{name} holds {file.stat().st_size} bytes, and {COMPLETE} lists {size}")
    (local / COMPLETE).write_text(json.dumps({"id": upload_id, "files": files}))  # last: this copy is complete
    return local


def store_error(url: str, error: BaseException) -> str:
    """One line for a store that refused: the URL, what went wrong and what to set."""
    name = type(error).__name__
    text = str(error).strip().splitlines()[0][:200] if str(error).strip() else name
    if "credential" in (name + text).lower() or "accessdenied" in (name + text).lower().replace(" ", ""):
        hint = ("set credentials: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (and AWS_ENDPOINT_URL for "
                "an S3-compatible server) for s3://, GOOGLE_APPLICATION_CREDENTIALS for gs://")
    elif "bucket" in (name + text).lower() or isinstance(error, FileNotFoundError):
        hint = "check the bucket's name and that it exists (fitjax does not create buckets)"
    else:
        hint = "check the URL, the network and the credentials"
    return f"{url!r}: {name}: {text}; {hint}."
