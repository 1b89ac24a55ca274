"""Compile once per machine: JAX's persistent compilation cache, on by default in fitjax's folder.

A Trainer turns the cache on when it first compiles (`fit`, `validate`, `test`, `predict`,
`generate`), never at `import fitjax`: a process that imports fitjax and trains nothing keeps
JAX's configuration as it was. The folder is `$XDG_CACHE_HOME/fitjax/xla` (else
`~/.cache/fitjax/xla`), bounded to `MAX_BYTES` (JAX evicts the least recently used programs
beyond it), and a program that compiled in under `MIN_COMPILE_SECONDS` is not stored (compiling
it again costs less than a file per program). On a second run of the same script every program
that was stored is read back instead of compiled (docs/guides/speed.md has the times).

`Trainer(compile_cache=...)` picks: True (fitjax's folder), a folder, or False (off). The
environment variable `FITJAX_COMPILE_CACHE` overrides: "0" turns it off for every trainer, a
folder replaces fitjax's folder. A cache configured any other way (`JAX_COMPILATION_CACHE_DIR`,
`jax.config.update("jax_compilation_cache_dir", ...)`, `set_cache_dir`) is the user's: fitjax
leaves it and its settings alone. JAX caches on CPU, GPU and TPU alike; with several processes
only process 0 writes (JAX's rule), and every process reads.

The cache is trusted code: share the folder only with users you trust (JAX's warning).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import jax
from jax.experimental.compilation_cache import compilation_cache

__all__ = ["ENV_VAR", "MAX_BYTES", "MIN_COMPILE_SECONDS", "check_setting", "default_folder", "folder_for", "use"]

log = logging.getLogger("fitjax")

ENV_VAR = "FITJAX_COMPILE_CACHE"
#: the cache's bound; beyond it JAX deletes the least recently used programs (the GPT example's
#: train step is ~5 MB on CPU, a 1B model's ~50 MB on TPU)
MAX_BYTES = 4 << 30
#: programs that compile faster than this are not stored (JAX's own default, kept explicit)
MIN_COMPILE_SECONDS = 1.0
_OFF = ("0", "false", "no", "off")
_JAX_DEFAULTS = {"jax_compilation_cache_max_size": -1, "jax_persistent_cache_min_compile_time_secs": 1.0}

# the folder this module set in JAX's configuration (None: none), and the settings it replaced
_ours: str | None = None
_replaced: dict[str, Any] = {}


def check_setting(value: Any) -> bool | str:
    """`Trainer(compile_cache=...)` checked: True, False or a folder (as a string)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (str, os.PathLike)) and str(value).strip():
        return os.fspath(value)
    raise ValueError(f"Trainer(compile_cache=...) takes True (fitjax's folder, {default_folder()}), False (off) "
                     f"or a folder, got {value!r}.")


def default_folder() -> str:
    """fitjax's folder: `$XDG_CACHE_HOME/fitjax/xla`, else `~/.cache/fitjax/xla`."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "fitjax", "xla")


def folder_for(setting: bool | str) -> str | None:
    """The folder a trainer's `compile_cache` setting caches in, `FITJAX_COMPILE_CACHE`'s
    override applied (None: off)."""
    env = os.environ.get(ENV_VAR, "").strip()
    if env.lower() in _OFF:
        return None
    if setting is False:
        return None
    if isinstance(setting, str):
        return os.path.abspath(os.path.expanduser(setting))
    return os.path.abspath(os.path.expanduser(env)) if env and env.lower() not in ("1", "true", "yes", "on") \
        else default_folder()


def use(setting: bool | str) -> str | None:
    """Points JAX's persistent cache at the folder `setting` asks for (see the module), unless
    the user configured a cache of their own; returns the folder in use (None: none of fitjax's)."""
    global _ours
    configured = jax.config.jax_compilation_cache_dir
    if configured is not None and configured != _ours:
        return None  # the user's cache, or another library's: theirs to run
    folder = folder_for(setting)
    if folder == configured:
        return folder
    if folder is None:  # an earlier trainer turned fitjax's cache on; this one asks for none
        _set("jax_compilation_cache_dir", None)
        for name, value in _replaced.items():
            _set(name, value)
        _replaced.clear()
        compilation_cache.reset_cache()  # JAX keeps the opened folder until told
        _ours = None
        return None
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
    except OSError as error:  # a read-only home: train anyway, compiling as before
        log.warning(f"fitjax: the compile cache stays off: cannot create {folder!r} ({error}); "
                    f"Trainer(compile_cache=<a writable folder>) or {ENV_VAR}=0 silences this.")
        return None
    if _ours is None:  # the thresholds are set once, and only where the user left JAX's defaults
        for name, value in ((("jax_compilation_cache_max_size", MAX_BYTES),) if _has_filelock() else ()) + (
                ("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS),):
            if getattr(jax.config, name) == _JAX_DEFAULTS[name]:
                _replaced[name] = getattr(jax.config, name)
                _set(name, value)
    else:
        compilation_cache.reset_cache()  # another folder than the one JAX opened
    _set("jax_compilation_cache_dir", folder)
    _ours = folder
    log.debug(f"fitjax: XLA's persistent compile cache in {folder}")
    return folder


def _has_filelock() -> bool:
    """Whether `filelock` imports: JAX bounds a cache's size with it, and without it JAX's cache
    fails to open at the first program and then stores and reads nothing, warning once per
    program (a fitjax dependency; a hand-assembled environment may lack it: unbounded then)."""
    try:
        import filelock  # noqa: F401
    except ImportError:
        log.warning("fitjax: the compile cache is unbounded: the `filelock` package is missing (pip install "
                    "filelock bounds it)")
        return False
    return True


def _set(name: str, value: Any) -> None:
    jax.config.update(name, value)
