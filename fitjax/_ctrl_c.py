"""Ctrl-C from `import fitjax` on: the script ends with status 130 and no traceback, whenever it
lands, and further Ctrl-Cs while the program exits stay quiet.

Python's own Ctrl-C is a `KeyboardInterrupt` that a script leaves uncaught: a traceback, then the
process kills itself with SIGINT (status -2 to its parent). Worse, JAX runs a callback at every
garbage collection, and `import jax` collects often: a Ctrl-C that lands in such a callback is
printed as "Exception ignored" and lost (the script trained to the end), and one that lands in a
C extension's initialisation (jaxlib's, NumPy's) is turned into an `ImportError`.

So `import fitjax` sets, before it imports JAX, a SIGINT handler (only where Python's default one
is set, in the main thread of a script: an interactive session or a notebook keeps Python's) that:
- during `import fitjax` itself, holds the Ctrl-C until the import is done and raises it then (a
  second Ctrl-C there ends the process at once, status 130);
- inside a garbage-collector callback, a `__del__` or anything a collection runs, holds it and
  raises it at the first Python event outside such code (see `held`);
- inside a host callback that XLA runs (`jax.debug.callback`), the same;
- inside XLA's compilation, holds it until the compilation returns and raises it then, saying
  so after a second; a second Ctrl-C there ends the process at once, status 130 (see
  `compiling`: a compilation left running crashes the interpreter's exit);
- anywhere else raises `Interrupted`: a `SystemExit` with status 130 (the program ends quietly
  unless something catches it) and a `KeyboardInterrupt` (code that catches Ctrl-C still does).

Once an `Interrupted` is raised, the interpreter's exit ignores further Ctrl-C (Lightning's
shutdown ignores them too): the exit's work (threads joined, `atexit` callbacks, JAX's backends
closed) finishes, no traceback is printed from it and the status stays 130. `Trainer.fit` has a
handler of its own while it runs (`fitjax.loop._interrupt`): its graceful shutdown, then
`Interrupted`.

This module imports nothing of JAX's: it runs before JAX is imported.
"""

from __future__ import annotations

import _thread
import contextlib
import gc
import os
import signal
import sys
import threading
import time
import traceback
from typing import Any, Callable

from fitjax import _jax_compat

__all__ = ["DEBUG_VAR", "STATUS", "Interrupted", "compiling", "debugging", "held", "imported", "in_host_callback",
           "install", "interrupted", "track_collections", "tracking_collections", "untrack_collections"]

STATUS = 130  # 128 + SIGINT, what a shell reports for a process Ctrl-C ended
DEBUG_VAR = "FITJAX_DEBUG"
RESEND_S = 0.001  # a Ctrl-C that landed where Python drops exceptions is sent again this often


class Interrupted(SystemExit, KeyboardInterrupt):
    """What Ctrl-C raises once fitjax is imported, and what `Trainer.fit` raises once its shutdown
    after Ctrl-C is done: a `SystemExit` with status 130, so the program ends without a traceback,
    and a `KeyboardInterrupt`, so `except KeyboardInterrupt:` still catches it.

    `announced`: whether Lightning's line ("Detected KeyboardInterrupt, ...") was said for it
    (a fit says it; a Ctrl-C outside a fit says nothing). `generated`: from `Trainer.generate`,
    the tokens it had made (what it returns, each row cut where the Ctrl-C stopped it); else
    None."""

    def __init__(self, *, announced: bool = False, generated: Any = None) -> None:
        super().__init__(STATUS)
        self.announced = announced
        self.generated = generated


def debugging() -> bool:
    """True when `FITJAX_DEBUG` asks for tracebacks (any value but "", "0", "false", "no")."""
    return os.environ.get(DEBUG_VAR, "").strip().lower() not in ("", "0", "false", "no")


def interrupted(*, announced: bool = False, generated: Any = None) -> Interrupted:
    """The `Interrupted` to raise now. If it ends the program, the exit ignores further Ctrl-C."""
    _quiet_exit()
    return Interrupted(announced=announced, generated=generated)


class _Exit:
    """Whether the interpreter's exit is to ignore Ctrl-C (set once an `Interrupted` was raised),
    and whether it began."""
    registered = False
    begun = False


def _quiet_exit() -> None:
    if _Exit.registered:
        return
    _Exit.registered = True
    # threading's exit hooks run first in the interpreter's exit, before threads are joined and
    # before `atexit` (a private hook of the standard library's, which concurrent.futures uses)
    register = getattr(threading, "_register_atexit", None)
    try:
        (register or __import__("atexit").register)(_ignore_ctrl_c)
    except RuntimeError:  # the exit has begun already
        _ignore_ctrl_c()


def _ignore_ctrl_c() -> None:
    _Exit.begun = True
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # kept to the very end (Python resets only its handlers)


class _Collection:
    """Whether a garbage collection is under way (between its "start" and "stop" callbacks)."""
    running = False

    @staticmethod
    def track(phase: str, info: dict) -> None:
        _Collection.running = phase == "start"


def track_collections() -> None:
    """Puts `_Collection.track` first among the garbage collector's callbacks (set before any
    other callback, JAX's included, runs); nothing if it is there."""
    if _Collection.track not in gc.callbacks:
        gc.callbacks.insert(0, _Collection.track)


def untrack_collections() -> None:
    with contextlib.suppress(ValueError):
        gc.callbacks.remove(_Collection.track)


def tracking_collections() -> bool:
    return _Collection.track in gc.callbacks


def swallowing(frame: Any) -> bool:
    """True when `frame` runs inside code whose exceptions Python drops: a garbage-collector
    callback, a `__del__`, or anything a collection runs (weak reference callbacks)."""
    if _Collection.running:
        return True
    callbacks = {getattr(cb, "__code__", None) for cb in gc.callbacks}
    while frame is not None:
        if frame.f_code in callbacks or frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


# Where JAX waits for XLA to compile, and where XLA's runtime runs a host callback: matched by
# name, not imported (this module runs before JAX is imported); `fitjax._jax_compat` names them.
# tests/loop/test_ctrl_c_phases.py fails if the names move.
_COMPILE_FILE, _COMPILE_FUNCTIONS = _jax_compat.COMPILE_FILE, _jax_compat.COMPILE_FUNCTIONS
COMPILE_NOTICE_S = 1.0  # a Ctrl-C that a compilation holds this long is announced
COMPILE_NOTICE = ("fitjax: Ctrl-C: stopping once XLA has finished compiling (leaving a compilation would "
                  "crash the exit); Ctrl-C again quits at once, without the shutdown's save")

_CALLBACK_FILE, _CALLBACK_FUNCTION = _jax_compat.CALLBACK_FILE, _jax_compat.CALLBACK_FUNCTION


def _compile_code(code: Any) -> bool:
    return code.co_name in _COMPILE_FUNCTIONS and code.co_filename.endswith(_COMPILE_FILE)


def in_host_callback(frame: Any) -> bool:
    """True when `frame` runs inside a host callback that XLA's runtime called: an exception
    raised there becomes a `JaxRuntimeError` ("CpuCallback error") with a traceback, not a
    Ctrl-C, so it is sent again until it lands outside (`held`)."""
    while frame is not None:
        code = frame.f_code
        if code.co_name == _CALLBACK_FUNCTION and code.co_filename.endswith(_CALLBACK_FILE):
            return True
        frame = frame.f_back
    return False


def compiling(frame: Any) -> bool:
    """True when `frame` runs inside JAX's call to XLA's compiler.

    jaxlib (0.10 on) checks for Ctrl-C while it waits for a compilation and, when the handler
    raises, returns at once and leaves the compilation running on the client's thread pool. If
    the program then ends, the interpreter's exit frees the client (its devices) under that
    compilation, which crashes with a segmentation fault (status -11: `examples/digits.py`
    Ctrl-C'd while compiling its train step; a script's 10 s `jax.jit` every time). So a Ctrl-C
    there waits for the compilation to return (seconds for most programs) and is raised then
    (`held`).
    """
    while frame is not None:
        if _compile_code(frame.f_code):
            return True
        frame = frame.f_back
    return False


class _Held:
    """A Ctrl-C that landed where it cannot be raised (`held`): what holds it ("compile",
    "swallow"), or None."""
    waiting: str | None = None
    pending = False  # the fallback with a profiler set: sent again from a thread
    sender: threading.Thread | None = None


def _holding(frame: Any) -> str | None:
    if compiling(frame):
        return "compile"
    if swallowing(frame) or in_host_callback(frame):
        return "swallow"
    return None


def held(frame: Any, *, quitting: Callable[[], None] | None = None) -> bool:
    """Whether a Ctrl-C that landed in `frame` must wait; False: the handler raises it now.
    `quitting` runs before a Ctrl-C during a held one ends the process (a fit's line).

    Inside XLA's compilation (`compiling`), code whose exceptions Python drops (`swallowing`) or
    JAX turns into its own (`in_host_callback`), it waits: a profile function (this thread's)
    calls the SIGINT handler again at the first Python event outside such code, and what the
    handler raises there is raised in that frame. So it lands right after the compilation or
    the garbage collection, whatever runs next (a resend timed from a thread, as before, starved
    when a loop mostly collects: a Ctrl-C in a script's set-up of `gc.collect()` and small arrays
    was lost 11 times in 16). A compilation's wait is announced after a second; a new Ctrl-C
    then ends the process at once, status 130 (that exit skips the interpreter's clean-up, which
    is what crashes beside a compilation). With another profile function set (a profiler), a
    Ctrl-C in a compilation is raised now, and one in a collection is sent again from a thread.
    """
    kind = _holding(frame)
    if kind is None:
        _Held.waiting, _Held.pending = None, False
        return False
    if kind == "compile" and _Held.waiting == "compile":
        if quitting is not None:
            with contextlib.suppress(Exception):
                quitting()
        _exit_now()
    if sys.getprofile() in (None, _release):
        _Held.waiting = kind
        sys.setprofile(_release)
        if kind == "compile":
            notice = threading.Timer(COMPILE_NOTICE_S, _announce_compiling)
            notice.daemon = True
            with contextlib.suppress(RuntimeError):  # at the interpreter's exit: no notice
                notice.start()
        return True
    if kind == "compile":
        return False
    _Held.pending = True
    if (_Held.sender is None or not _Held.sender.is_alive()) and not _Exit.begun:
        _Held.sender = threading.Thread(target=_send_again, name="fitjax-ctrl-c", daemon=True)
        with contextlib.suppress(RuntimeError):  # no new thread at the interpreter's exit: the Ctrl-C is moot
            _Held.sender.start()
    return True


def _release(frame: Any, event: str, arg: Any) -> None:
    """The profile function while a Ctrl-C is held: at the first event outside what holds it,
    the SIGINT handler runs again here (what it raises is raised in `frame`). Nothing runs it
    while the thread waits in XLA; a collection's callbacks are a few events."""
    if _holding(frame) is not None:
        return
    sys.setprofile(None)
    _Held.waiting = None
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        handler(signal.SIGINT, frame)


def _send_again() -> None:
    # (with a profiler set) sent only while no collection runs, where the handler would hold
    # it again; every millisecond
    while _Held.pending and not _Exit.begun:
        time.sleep(RESEND_S)
        if _Held.pending and not _Collection.running:
            _thread.interrupt_main()


def _announce_compiling() -> None:
    if _Held.waiting == "compile" and not _Exit.begun:
        with contextlib.suppress(Exception):
            print(COMPILE_NOTICE, file=sys.stderr, flush=True)


class _Import:
    """`import fitjax` is running; a Ctrl-C during it is held until it is done."""
    running = False
    held = False


def _on_sigint(signum: int, frame: Any) -> None:
    """Ctrl-C once fitjax is imported, outside a fit (see the module docstring)."""
    if _Import.running and "fitjax" in sys.modules:  # (a failed import leaves no "fitjax" there)
        if _Import.held:  # a second Ctrl-C: do not make the user wait for the import
            _exit_now()
        _Import.held = True
        return
    if _Exit.registered and _in_shutdown(frame):  # the exit began, its hooks not run yet: quiet now
        _ignore_ctrl_c()
        return
    if held(frame):
        return
    if debugging():
        traceback.print_stack(frame)  # where it landed
    raise interrupted()


def _in_shutdown(frame: Any) -> bool:
    """Whether `frame` runs in the interpreter's exit, in `threading._shutdown` before its exit
    hooks (where `_ignore_ctrl_c` is registered) have run: a Ctrl-C every 50 ms landed there once,
    under load, and was printed as "Exception ignored" with status -2."""
    shutdown = getattr(getattr(threading, "_shutdown", None), "__code__", None)
    while frame is not None:
        if frame.f_code is shutdown:
            return True
        frame = frame.f_back
    return False


def _exit_now() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(STATUS)


def install() -> None:
    """At the start of `import fitjax`: the handler, where Python's default one is set in a
    script's main thread (an interactive session or a notebook keeps Python's), and the
    collection tracking `swallowing` reads."""
    track_collections()
    interactive = sys.flags.interactive or hasattr(sys, "ps1") or "IPython" in sys.modules
    if (threading.current_thread() is threading.main_thread() and not interactive
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
        _Import.running = True
        signal.signal(signal.SIGINT, _on_sigint)


def imported() -> None:
    """At the end of `import fitjax`: a Ctrl-C held during it is raised now."""
    _Import.running = False
    if _Import.held:
        _Import.held = False
        raise interrupted()
