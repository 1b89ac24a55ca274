"""Modules imported on first use, so `import fitjax` stays light (a test holds it to that)."""

from __future__ import annotations

import importlib
import sys
import threading
from types import ModuleType
from typing import Any

__all__ = ["LazyModule", "import_without"]


class LazyModule:
    """Stands for a module and imports it at the first attribute read.

    `ocp = LazyModule("orbax.checkpoint")` at the top of a module reads like the import it replaces;
    the ~0.3 s (and tensorstore) are paid by the first `ocp.X` that runs, not by `import fitjax`.
    After the import each read is a `sys.modules` lookup.
    """

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        return getattr(importlib.import_module(self._name), attr)

    def import_soon(self) -> None:
        """Imports the module on a daemon thread now, unless it is imported or being imported,
        so that the first read does not wait for it: started where the caller's thread spends a
        while outside Python (compiling), the import costs it almost nothing. A failed import
        is left for the first read to raise. A first read made before the import ends waits for
        it (Python's import lock)."""
        if self._name in sys.modules or self._name in _STARTED:
            return
        _STARTED.add(self._name)
        threading.Thread(target=_import_quietly, args=(self._name,), name=f"import {self._name}", daemon=True).start()

    def __repr__(self) -> str:
        return f"LazyModule({self._name!r})"


_STARTED: set[str] = set()  # modules `import_soon` began importing


def _import_quietly(name: str) -> None:
    try:
        importlib.import_module(name)
    except BaseException:  # noqa: BLE001  # the first read imports it again and raises there
        pass


def import_without(name: str, blocked: str) -> ModuleType:
    """Imports `name` as if `blocked` were not installed, unless `blocked` is already imported.

    For optional imports a library makes only to recognise the blocked package's types: it then
    falls back as it does without that package, and the blocked package stays free to import
    later. Used for tensorboardX, which imports torch (~3 s) at import time only to annotate
    argument types with `torch.Tensor`.
    """
    if blocked in sys.modules or name in sys.modules:
        return importlib.import_module(name)
    sys.modules[blocked] = None  # type: ignore[assignment]  # makes `import blocked` raise ImportError
    try:
        return importlib.import_module(name)
    finally:
        if sys.modules.get(blocked, ...) is None:
            del sys.modules[blocked]
