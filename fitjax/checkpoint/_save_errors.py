"""A failed save said in one line: what Orbax's threads print about it goes to fitjax's debug log.

When a save fails inside Orbax (a full disk: every array's write fails at once), Orbax logs each
of its threads' tracebacks at ERROR through absl ("_SignalingThread.run() raised an exception"),
tensorstore reports the callbacks it can no longer deliver to Orbax's closed event loop as
unraisable `RuntimeError('Event loop is closed')`, and the error raised holds Orbax's frames: 110
lines and more before fitjax's `SaveFailed`. While fitjax's writer saves, those records and
reports are logged at DEBUG on the `fitjax` logger instead (`logging.getLogger("fitjax")
.setLevel(logging.DEBUG)` shows them), and `describe` says the failure in one line, naming a full
disk as such.
"""

from __future__ import annotations

import errno
import logging
import sys
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["describe", "route_orbax_reports"]

log = logging.getLogger("fitjax")

_FULL = {errno.ENOSPC: "the disk is full (No space left on device). Free space there",
         errno.EDQUOT: "the disk quota is used up (Disk quota exceeded). Free space there",
         errno.EFBIG: "a file would pass this process's file-size limit (File too large). Raise it (`ulimit -f`)"}
_FULL_TEXT = {"No space left on device": errno.ENOSPC, "Disk quota exceeded": errno.EDQUOT,
              "File too large": errno.EFBIG}


def describe(error: BaseException, first_line: Callable[[BaseException], str]) -> str:
    """What went wrong, in one line: a full disk (or quota, or file-size limit) said as such,
    with what to do; anything else as its type and first line."""
    seen: BaseException | None = error
    while seen is not None:
        code = getattr(seen, "errno", None)
        if code not in _FULL:  # tensorstore's errors carry the system's words, not an errno
            code = next((c for text, c in _FULL_TEXT.items() if text in str(seen)), None)
        if code is not None:
            return f"{_FULL[code]}, or save elsewhere (ModelCheckpoint(dirpath=...)); the checkpoints before it stay"
        seen = seen.__cause__ or seen.__context__
    return f"{type(error).__name__}: {first_line(error)}"


class _OrbaxThreadReports(logging.Filter):
    """Takes the ERROR records Orbax's code logs through absl while `saving()` holds (its
    threads' tracebacks of the failure `SaveFailed` reports) down to DEBUG on `fitjax`."""

    def __init__(self, saving: Callable[[], bool]) -> None:
        super().__init__()
        self.saving = saving

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR or "orbax" not in record.pathname or not self.saving():
            return True
        log.debug("fitjax: Orbax, during a failed save: %s", record.getMessage(), exc_info=record.exc_info)
        return False


_ROUTED = threading.Lock()
_routed = False


def route_orbax_reports(saving: Callable[[], bool]) -> None:
    """Routes Orbax's and tensorstore's reports of a failing save to the debug log while
    `saving()` holds: installed once, at a process's first save (nothing at import); the
    unraisable hook hands everything else to the one it replaced."""
    global _routed
    with _ROUTED:
        if _routed:
            return
        _routed = True
    logging.getLogger("absl").addFilter(_OrbaxThreadReports(saving))
    previous = sys.unraisablehook

    def hook(report: Any) -> None:
        if _closed_loop(report) and saving():
            log.debug("fitjax: tensorstore, during a failed save: %s", report.exc_value,
                      exc_info=(report.exc_type, report.exc_value, report.exc_traceback))
            return
        previous(report)

    sys.unraisablehook = hook


def _closed_loop(report: Any) -> bool:
    """tensorstore's report of a result it could not hand to Orbax's event loop, closed once the
    save had failed: `call_soon_threadsafe` on a closed loop, raised with no object."""
    return (report.object is None and report.exc_type is RuntimeError
            and str(report.exc_value) == "Event loop is closed")
