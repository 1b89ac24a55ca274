"""The versioned run folder the file loggers share: `<save_dir>/<name>/version_<N>/`.

`save_dir` may be an object-store URL (`s3://bucket/runs`, `gs://bucket/runs`): the logger then
writes into a local mirror of its folder and uploads the files that changed on `save()` (each
checkpoint save calls it) and `finalize()`, through the one file layer (`fitjax._storage`). On a
store the version folder is claimed by creating `<version folder>/.fitjax-claim` only if absent
(S3's conditional `PUT`): as `mkdir` on disk, exactly one of several runs gets each version.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import sys
import warnings
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any


from fitjax import _stack, _storage
from fitjax.loggers._base import Logger
from fitjax.strategies import broadcast_str

_VERSION_FOLDER = re.compile(r"version_(\d+)")


def next_version(root: Path) -> int:
    """One past the largest `version_<N>` folder in `root`; 0 when there is none.

    Example:
        >>> next_version(Path("no/such/folder"))
        0
    """
    if _storage.is_url(root):  # one listing, retried as every store request (a blip at fit start)
        names = _storage.names(root)
    elif root.is_dir():
        names = [p.name for p in root.iterdir() if p.is_dir()]
    else:
        return 0
    matches = (_VERSION_FOLDER.fullmatch(name) for name in names)
    taken = [int(m.group(1)) for m in matches if m]
    return max(taken, default=-1) + 1


CLAIM = ".fitjax-claim"  # on a store, the object whose creation claims its version folder


def claim_version(root: Path) -> int:
    """The next unused `version_<N>` in `root`, claimed by creating its folder: `mkdir` either
    creates it or fails, so two runs started at once in one folder never share a version. On a
    store (`root` a URL) the claim is `version_<N>/.fitjax-claim`, created only if absent.

    Example:
        >>> import tempfile
        >>> root = Path(tempfile.mkdtemp())
        >>> claim_version(root), claim_version(root)
        (0, 1)
    """
    if not _storage.is_url(root):
        return _claim_version(root)
    try:
        return _claim_version(root)
    except Exception as error:  # noqa: BLE001 - botocore, gcsfs and fsspec raise many kinds
        # the first store request of a run under an s3:// default_root_dir: the same one line as
        # ModelCheckpoint's probe, rather than a botocore traceback without the URL
        raise PermissionError(f"the logger cannot write its version folder to "
                              f"{_storage.store_error(str(root), error)}") from None


def _claim_version(root: Path) -> int:
    on_store = _storage.is_url(root)
    if not on_store:
        root.mkdir(parents=True, exist_ok=True)
    version = next_version(root)
    while True:
        folder = root / f"version_{version}"
        try:
            if on_store:
                try:
                    if _storage.create_new(folder / CLAIM, str(os.getpid()).encode()):
                        return version
                except NotImplementedError as error:  # a filesystem without exclusive creation
                    warnings.warn(f"{error}: version_{version} under {str(root)!r} is the next unused one "
                                  "by listing, which two runs started at the same moment can both pick.",
                                  stacklevel=_stack.user_stacklevel())
                    return version
            else:
                folder.mkdir()
                return version
        except FileExistsError:
            pass
        version += 1  # another run claimed it between the listing and here


_MIRRORS: "weakref.WeakSet[VersionedLogger]" = weakref.WeakSet()  # loggers holding a mirror


@atexit.register
def _remove_mirrors() -> None:
    """At the process's end, the mirrors of loggers never finalized are removed once every file
    in them is on the store; one holding what did not reach it is kept, and named."""
    for logger in list(_MIRRORS):
        mirror = logger._mirror
        if mirror is None:
            continue
        if logger._pending_files():
            print(f"fitjax: the logs in {mirror} did not reach {logger.log_dir}; kept there.", file=sys.stderr)
        else:
            shutil.rmtree(mirror, ignore_errors=True)


class VersionedLogger(Logger):
    """A logger that writes files into `<save_dir>/<name>/<version folder>/`, on process 0 only.

    The version is picked the first time it is asked for (the next unused `version_<N>`, like
    Lightning); `claim_version()`, which `Trainer.fit` calls first, creates that folder on process
    0 (the next free one if another run took it meanwhile) and tells the other processes, so two
    runs started at once in one `save_dir` never share a version. A resumed run continues the
    checkpoint's version, and the folder it claimed, still empty, is removed. An explicit int version
    means `version_<int>`, a string is the folder name itself.

    Subclasses call `_is_writer()` before doing anything and `_open()` to get the folder.
    """

    def __init__(
        self,
        save_dir: str | os.PathLike[str],
        name: str,
        version: int | str | None,
        *,
        process_index: int | None,
    ) -> None:
        owner = type(self).__name__
        if not isinstance(save_dir, (str, os.PathLike)):
            raise TypeError(f"`{owner}(save_dir=...)` must be a str or a path; got {save_dir!r}.")
        if not isinstance(name, str) or os.sep in name or (os.altsep and os.altsep in name):
            raise ValueError(
                f"`{owner}(name=...)` must be a str without path separators (use '' for none); "
                f"got {name!r}. To nest runs deeper, put the extra folders in `save_dir`."
            )
        _check_version(f"`{owner}(version=...)`", version)
        if process_index is not None and not is_int(process_index):
            raise TypeError(
                f"`{owner}(process_index=...)` must be an int or None (jax.process_index()); "
                f"got {process_index!r}."
            )
        # a URL as an epath.Path; a local folder stays as given (relative paths stay relative)
        self._save_dir = _storage.folder(save_dir)
        self._mirror: Path | None = None  # the local copy written to, for a store URL
        self._uploaded: dict[str, tuple[int, int]] = {}  # mirror file -> (size, mtime) last uploaded
        self._name = name
        self._explicit_version = version
        self._version = version
        self._process_index = process_index
        self._opened = False
        self._claimed: Path | None = None  # the version folder claim_version() made
        # Resume bookkeeping: the last step logged, and the first step to drop from an earlier
        # attempt of this run (set by load_state_dict, consumed by the first write).
        self._last_step: int | None = None
        self._purge_step: int | None = None

    @property
    def name(self) -> str:
        """The experiment folder under `save_dir`."""
        return self._name

    @property
    def version(self) -> int | str:
        """The run's version: chosen on first access unless given, then fixed."""
        if self._version is None:
            self._version = next_version(self._save_dir / self._name)
        return self._version

    def claim_version(self) -> None:
        if self._version is not None or self._explicit_version is not None:
            return  # given, restored or claimed already
        root = self._save_dir / self._name
        version = str(claim_version(root)) if self._is_writer() else ""
        self._version = int(broadcast_str(version))  # a collective: every process is here
        if self._is_writer():
            self._claimed = self.log_dir

    @property
    def given_version(self) -> int | str | None:
        """The version passed to the constructor; None when the run takes the next unused one.
        `ckpt_path="last"` looks only in a given version's checkpoints."""
        return self._explicit_version

    @property
    def save_dir(self) -> Path:
        """The root folder passed to the constructor."""
        return self._save_dir

    @property
    def log_dir(self) -> Path:
        """`<save_dir>/<name>/version_<N>` (or the string version as the last folder)."""
        version = self.version
        folder = version if isinstance(version, str) else f"version_{version}"
        return self._save_dir / self._name / folder

    def state_dict(self) -> dict[str, Any]:
        """`{"version": ..., "step": last step logged}`: enough to continue the same folder."""
        return {"version": self.version, "step": self._last_step}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continues the run folder saved in `state`; call it before the first write.

        Points the earlier attempt logged after `state["step"]` are dropped on the first write, so
        a run resumed from a checkpoint shows no doubled curve. A `version` given to the
        constructor wins over the restored one.
        """
        owner = type(self).__name__
        version, step = state.get("version"), state.get("step")
        _check_version(f'`{owner}.load_state_dict(state)["version"]`', version)
        if step is not None and not is_int(step):
            raise TypeError(
                f'`{owner}.load_state_dict(state)["step"]` must be an int or None; got {step!r}. '
                f"Pass what `state_dict()` returned."
            )
        if self._explicit_version is not None and self._explicit_version != version:
            return
        if self._opened and version != self._version:
            raise RuntimeError(
                f"`{owner}.load_state_dict` got version {version!r} after the logger already wrote to "
                f"{str(self.log_dir)!r}. Restore the logger state before logging anything."
            )
        if self._claimed is not None and version != self._version:
            with contextlib.suppress(OSError):  # holds files already: kept
                if _storage.is_url(self._claimed):
                    if [p.name for p in self._claimed.iterdir()] == [CLAIM]:
                        (self._claimed / CLAIM).unlink()
                else:
                    self._claimed.rmdir()
            self._claimed = None
        self._version = version
        self._last_step = step
        self._purge_step = None if step is None else step + 1

    _APPENDED: tuple[str, ...] = ()  # files later writes add to (not rewrite): fetched into a new mirror

    def _open(self) -> Path:
        """The local folder to write files in: the log dir, or for a store its local mirror."""
        path = self.log_dir
        if _storage.is_url(path):
            if self._mirror is None:
                self._mirror = _storage.temp_folder("logs")
                _MIRRORS.add(self)
                if self._opened:  # written and released before (finalize): go on from the store's
                    for name in self._APPENDED:
                        _storage.get_file(path / name, self._mirror / name)
            path = self._mirror
        if not self._opened:
            path.mkdir(parents=True, exist_ok=True)
            self._opened = True
        return path

    def _release_mirror(self) -> None:
        """Removes the local mirror once its files are on the store (the logger's `finalize`);
        logging after it makes a new one. Nothing else in the temporary folder is touched."""
        mirror, self._mirror, self._uploaded = self._mirror, None, {}
        if mirror is not None:
            _MIRRORS.discard(self)
            shutil.rmtree(mirror, ignore_errors=True)

    def _upload(self) -> None:
        """Copies the mirror's new and changed files to the store (nothing for a local folder)."""
        for file, seen in self._pending_files():
            relative = file.relative_to(self._mirror).as_posix()
            _storage.put_file(file, self.log_dir / relative)
            self._uploaded[str(file)] = seen

    def _pending_files(self) -> list[tuple[Path, tuple[int, int]]]:
        """The mirror's files new or changed since their last upload, with their (size, mtime)."""
        if self._mirror is None:
            return []
        pending = []
        for file in sorted(p for p in self._mirror.rglob("*") if p.is_file()):
            stat = file.stat()
            seen = (stat.st_size, stat.st_mtime_ns)
            if self._uploaded.get(str(file)) != seen:
                pending.append((file, seen))
        return pending

    def _take_purge_step(self) -> int | None:
        step, self._purge_step = self._purge_step, None
        return step

    def _note_step(self, step: int) -> None:
        if self._last_step is None or step > self._last_step:
            self._last_step = step


def is_int(value: object) -> bool:
    """True for ints, not for bools (which are ints to Python)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _check_version(where: str, version: object) -> None:
    ok = (
        version is None
        or (is_int(version) and version >= 0)
        or (isinstance(version, str) and version not in ("", ".", "..") and os.sep not in version)
    )
    if not ok:
        raise ValueError(
            f"{where} must be None (next unused version_<N>), an int >= 0 "
            f"(folder version_<int>) or a folder name without path separators; got {version!r}."
        )
