"""Where files go: local folders, or object-store URLs (`s3://bucket/run`, `gs://bucket/run`).

Every path argument goes through `as_path`: a local path becomes an absolute `pathlib.Path`
(`~` expanded), a URL an `etils.epath.Path`, which Orbax brings and which reaches the store
through fsspec (`s3fs` for `s3://`, `gcsfs` for `gs://`): the one file layer for small files.

Checkpoints on a store. Orbax (0.12) writes arrays to local folders and `gs://` only, and a store
has no atomic rename, so a checkpoint for a URL is written by Orbax into a local staging folder
on the writer's thread, then uploaded file by file with `COMMIT` uploaded last: a reader (and
`damage`) counts a checkpoint on a store complete only once `COMMIT` is there, so it never sees a
half-uploaded one. Deleting one removes `COMMIT` first. Reading one downloads it once into a
per-process cache (a checkpoint folder is never changed once committed).
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Union

from etils import epath

__all__ = ["COMMIT", "AnyPath", "as_path", "commit", "create_new", "download", "folder", "is_url", "put_file", "put_folder", "remove",
           "store_error", "upload"]

AnyPath = Union[Path, epath.Path]
COMMIT = "commit_success.txt"  # Orbax's own name for the marker it writes on gs://
_URL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")
_CACHE: Path | None = None


def is_url(path: str | os.PathLike) -> bool:
    """True for `s3://...`, `gs://...` and other URLs."""
    return bool(_URL.match(os.fspath(path)))


def as_path(path: str | os.PathLike) -> AnyPath:
    """A URL as an `epath.Path`; a local path with `~` expanded, made absolute (Orbax takes
    absolute paths only, and later working directories must not matter)."""
    text = os.fspath(path)
    if is_url(text):
        return epath.Path(text)
    return Path(os.path.abspath(os.path.expanduser(text)))


def folder(path: str | os.PathLike) -> AnyPath:
    """A URL as an `epath.Path`; a local path as a `pathlib.Path`, as given (a relative one stays
    relative, unlike `as_path`)."""
    return as_path(path) if is_url(path) else Path(path)


def _fs(path: AnyPath):
    import fsspec  # noqa: PLC0415 - only for stores

    try:
        return fsspec.core.url_to_fs(os.fspath(path))
    except ImportError as error:  # s3fs / gcsfs missing
        scheme = os.fspath(path).split("://")[0]
        package = {"s3": "s3fs", "gs": "gcsfs", "gcs": "gcsfs"}.get(scheme, f"the fsspec package for {scheme}://")
        raise ImportError(f"{os.fspath(path)!r} needs {package}: pip install {package} "
                          "(or pip install 'fitjax[stores]').") from error


def upload(local: Path, target: AnyPath) -> None:
    """Copies the folder `local` to the store folder `target`, then writes `target/COMMIT`."""
    put_folder(local, target)
    commit(target)


def commit(target: AnyPath) -> None:
    """Writes `target/COMMIT`: the store folder `target` is complete (call it last)."""
    fs, root = _fs(target)
    fs.pipe_file(f"{root}/{COMMIT}", uuid.uuid4().hex.encode())


def put_folder(local: Path, target: AnyPath) -> None:
    """Copies every file under the local folder `local` to the same place under `target`."""
    fs, root = _fs(target)
    for file in sorted(p for p in local.rglob("*") if p.is_file()):
        fs.put_file(str(file), f"{root}/{file.relative_to(local).as_posix()}")


def create_new(target: AnyPath, data: bytes = b"") -> bool:
    """Creates the store object `target` only if there is none: True if this call created it,
    False if it existed. The store decides (S3's conditional `PUT` with `If-None-Match: *`), so
    of several processes creating one object at once exactly one gets True.

    Raises `NotImplementedError` for a filesystem without exclusive creation.
    """
    fs, root = _fs(target)
    try:
        fs.pipe_file(root, data, mode="create")
    except FileExistsError:
        return False
    except (TypeError, ValueError) as error:  # a filesystem without mode="create"
        raise NotImplementedError(f"{type(fs).__name__} cannot create {os.fspath(target)!r} exclusively") from error
    except OSError as error:  # s3fs reports S3's 412 Precondition Failed as an OSError
        if "precondition" in str(error).lower() or "412" in str(error):
            return False
        raise
    return True


def put_file(local: Path, target: AnyPath) -> None:
    """Copies the local file `local` to the store path `target`."""
    fs, root = _fs(target)
    fs.put_file(str(local), root)


def remove(target: AnyPath) -> None:
    """Deletes the store folder `target`, its `COMMIT` first (no reader takes it as complete
    while its files go)."""
    fs, root = _fs(target)
    if fs.exists(f"{root}/{COMMIT}"):
        fs.rm_file(f"{root}/{COMMIT}")
    if fs.exists(root):
        fs.rm(root, recursive=True)


def download(target: AnyPath) -> Path:
    """A local copy of the committed store folder `target`, downloaded once per commit."""
    global _CACHE
    fs, root = _fs(target)
    commit = fs.cat_file(f"{root}/{COMMIT}").decode().strip() or "commit"
    if _CACHE is None:
        _CACHE = Path(tempfile.mkdtemp(prefix="fitjax-store-"))
        atexit.register(shutil.rmtree, _CACHE, True)
    local = _CACHE / commit / target.name
    if not (local / COMMIT).is_file():
        for remote in fs.find(root):
            file = local / remote[len(root):].lstrip("/")
            file.parent.mkdir(parents=True, exist_ok=True)
            fs.get_file(remote, str(file))
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
