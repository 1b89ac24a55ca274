"""Names read from a checkpoint that become paths, checked before anything is written.

A checkpoint may come from a folder or bucket someone else can write to. What fitjax reads from
it to build a path (a store checkpoint's `.fitjax-complete`: its `id` and file list; a
`ModelCheckpoint`'s saved paths) is accepted only when it stays where it belongs: a relative,
normalised name inside the checkpoint, an `id` of the form fitjax writes. Anything else is an
`UnsafeName` naming the entry, raised before the first byte is written.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
from pathlib import Path
from typing import Any

__all__ = ["UnsafeName", "check_folder", "check_id", "check_in_folder", "check_inside", "check_name", "check_record",
           "check_relative"]

_URL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")
_ID = re.compile(r"[0-9a-f]{32}")  # `uuid.uuid4().hex`, what `_storage.commit` writes
_DRIVE = re.compile(r"^[A-Za-z]:")


class UnsafeName(ValueError):
    """A name read from a checkpoint that would put a file outside the checkpoint (absolute,
    escaping with `..`, not normalised, or not of the expected form)."""


def relative_problem(name: Any) -> str | None:
    """Why `name` is not a relative, normalised POSIX path that stays where it is joined, or None."""
    if not isinstance(name, str) or not name:
        return "not a non-empty string"
    if any(ord(c) < 32 or ord(c) == 127 for c in name) or "\\" in name:
        return "control characters or backslashes"
    if name.startswith("/") or _DRIVE.match(name) or name.startswith("~"):
        return "an absolute path"
    parts = name.split("/")
    if ".." in parts:
        return "it climbs out with '..'"
    if any(part in ("", ".") for part in parts) or posixpath.normpath(name) != name:
        return "not a normalised path (empty or '.' parts)"
    return None


def check_relative(name: Any, *, entry: str) -> str:
    """`name` if it is a relative, normalised POSIX path; else `UnsafeName` naming `entry`."""
    problem = relative_problem(name)
    if problem is not None:
        raise UnsafeName(f"{entry} names {name!r} ({problem}), not a relative path inside the checkpoint; "
                         "refused, nothing written")
    return name


def check_name(name: Any, *, entry: str) -> str:
    """`name` if it is one plain folder or file name (no separator); else `UnsafeName`."""
    check_relative(name, entry=entry)
    if "/" in name:
        raise UnsafeName(f"{entry} names {name!r}, which is not a single name (it holds '/'); refused, "
                         "nothing written")
    return name


def check_folder(folder: Any, *, entry: str) -> str:
    """`folder` if it is an absolute, normalised local path or a URL whose path is normalised
    (no `..`); else `UnsafeName` naming `entry`."""
    if isinstance(folder, str) and _URL.match(folder):
        rest = folder.split("://", 1)[1]
    elif isinstance(folder, str) and folder.startswith("/") and not folder.startswith("//"):
        rest = folder[1:]
    else:
        raise UnsafeName(f"{entry} names {folder!r}, which is not an absolute folder path or a URL; refused, "
                         "nothing written")
    if rest and (problem := relative_problem(rest)) is not None:
        raise UnsafeName(f"{entry} names {folder!r} ({problem}); refused, nothing written")
    return folder


def check_id(value: Any, *, entry: str) -> str:
    """`value` if it is a checkpoint upload's id (32 lowercase hex digits); else `UnsafeName`."""
    if not isinstance(value, str) or not _ID.fullmatch(value):
        raise UnsafeName(f"{entry} has the id {value!r}, which is not a checkpoint id (32 hex digits); "
                         "refused, nothing written")
    return value


def check_inside(path: Path, root: Path, *, entry: str) -> Path:
    """`path` if, links resolved, it lies inside the local folder `root` (a folder on the way
    that is a link elsewhere counts as outside); else `UnsafeName`."""
    real, base = Path(os.path.realpath(path)), Path(os.path.realpath(root))
    if real != base and base not in real.parents:
        raise UnsafeName(f"{entry}: {str(path)!r} leads to {str(real)!r}, outside {str(root)!r}; refused, "
                         "nothing written")
    return path


def check_record(raw: bytes, entry: str, name: str, *, markers: tuple[str, ...]) -> tuple[str, dict[str, int]]:
    """`(id, files)` of a store checkpoint's completion record `raw` (the object `entry`, in the
    checkpoint folder `name`): every entry checked to name a place inside the checkpoint, none of
    fitjax's own `markers`; else `UnsafeName` naming it."""
    try:
        record = json.loads(raw)
    except ValueError:
        record = None
    if not isinstance(record, dict) or not isinstance(record.get("files"), dict):
        raise UnsafeName(f"{entry} is not a file list (JSON with 'id' and 'files'); refused, nothing written")
    check_name(name, entry="the checkpoint's folder")
    upload_id = check_id(record.get("id"), entry=entry)
    files = record["files"]
    for file, size in files.items():
        check_relative(file, entry=f"{entry}'s file list")
        if file in markers:
            raise UnsafeName(f"{entry}'s file list names {file!r}, fitjax's own marker; refused, nothing written")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise UnsafeName(f"{entry}'s file list gives {file!r} the size {size!r}, not a number of bytes; "
                             "refused, nothing written")
        for parent in Path(file).parents:
            if str(parent) in files:  # a file and a folder of one name: one would replace the other
                raise UnsafeName(f"{entry}'s file list names {str(parent)!r} both as a file and as the folder "
                                 f"of {file!r}; refused, nothing written")
    return upload_id, files


def check_in_folder(path: Any, folder: Any, *, entry: str) -> str:
    """`path` if it is `<folder>/<one plain name>`; else `UnsafeName` naming `entry`."""
    if not isinstance(path, str) or not isinstance(folder, str) or not path.startswith(folder + "/"):
        raise UnsafeName(f"{entry} names {path!r}, which is not in the saved dirpath {folder!r}; refused, "
                         "nothing written")
    check_name(path[len(folder) + 1:], entry=entry)
    return path
