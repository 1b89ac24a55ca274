"""What every benchmark's `--json` file holds beside its own figures: where and how it was measured.

`record(path, figures)` writes `{"command", "commit", "date", "machine": {...}, **figures}`: the
command line, the commit (git's, or `$FITJAX_COMMIT` where the tree travelled without its .git),
the UTC date, and the versions and device the figures came from, so every figure the docs quote
names the run that produced it.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import shlex
import subprocess
import sys
from typing import Any

PACKAGES = ("jax", "jaxlib", "libtpu", "flax", "optax", "orbax-checkpoint", "numpy")


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def commit() -> str:
    if os.environ.get("FITJAX_COMMIT"):
        return os.environ["FITJAX_COMMIT"]
    try:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        return subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine() -> dict[str, Any]:
    import jax

    devices = jax.devices()
    return {"host": platform.node(), "python": platform.python_version(), "cpus": os.cpu_count(),
            "platform": devices[0].platform, "device_kind": devices[0].device_kind, "device_count": len(devices),
            "memory_bytes": (devices[0].memory_stats() or {}).get("bytes_limit"),
            "versions": {name: _version(name) for name in PACKAGES}}


def record(path: str | None, figures: dict[str, Any]) -> None:
    """Writes `figures` with the run's provenance to `path` (nothing when `path` is None)."""
    if not path:
        return
    payload = {"command": shlex.join([os.path.relpath(sys.argv[0]), *sys.argv[1:]]), "commit": commit(),
               "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
               "machine": machine(), **figures}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as file:
        json.dump(payload, file, indent=1, default=str)
