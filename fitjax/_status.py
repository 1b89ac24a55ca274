"""What a fit is doing while it sets up: one status line per slow phase (initialising the state,
compiling each step), so the seconds after the banner are never silent.

On a terminal a phase's line shows while it runs ("fitjax: initialising the state…") and is
completed in place when it ends ("fitjax: initialised the state in 5.6 s"); in a log file the line
is written once, when the phase ends, with its time. Only process 0 writes, and nothing when the
"fitjax" logger is off (`logging.getLogger("fitjax").setLevel(logging.WARNING)`, as for the
banner); when the application configured logging itself, the ended lines go to the logger.

The lines go where `showing_on` points them: a progress bar hands its `rich` console over, so the
lines share its stream and, while the bar is drawn (`live()`), the bar's own row says what
compiles and the ended line is printed above the bar. Without one, stdout.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import sys
import time
from typing import Any, Callable, Iterator

import jax

__all__ = ["Lines", "phase", "showing_on", "step_compiled", "step_compiling", "training_ended"]

log = logging.getLogger("fitjax")
_CLEAR_LINE = "\r\x1b[2K"


class Lines:
    """Status lines on `console` (a `rich.console.Console`; None: stdout), or to the "fitjax"
    logger when the application configured logging; `live()`: a bar is drawn on the console now;
    `close()`: the train batches are over, a drawn train bar is closed (`training_ended`)."""

    def __init__(self, console: Any = None, *, live: Callable[[], bool] = lambda: False,
                 close: Callable[[], None] = lambda: None) -> None:
        self._console = console
        self._live = live
        self.close = close
        self._open = False  # a started line is on the terminal, not ended yet

    def _stream(self):
        return sys.stdout if self._console is None else self._console.file

    def _terminal(self) -> bool:
        if self._console is not None:
            return self._console.is_terminal
        return bool(getattr(sys.stdout, "isatty", lambda: False)())

    def _quiet(self) -> bool:
        return jax.process_index() != 0 or not log.isEnabledFor(logging.INFO)

    def _to_logger(self) -> bool:
        """The application routes the "fitjax" logger (its own handlers, not fitjax's stdout one)."""
        return self._console is None and (log.propagate or not log.handlers)

    def start(self, doing: str) -> None:
        """Shows "fitjax: <doing>…" while it runs (a terminal with no bar drawn; else nothing)."""
        if self._quiet() or self._to_logger() or self._live() or not self._terminal():
            return
        stream = self._stream()
        stream.write(f"fitjax: {doing}…")
        stream.flush()
        self._open = True

    def end(self, done: str) -> None:
        """"fitjax: <done>", in place of the started line on a terminal."""
        if self._quiet():
            return
        line = f"fitjax: {done}"
        if self._to_logger():
            log.info(line)
            return
        if self._open:
            self._stream().write(_CLEAR_LINE)
            self._open = False
        if self._console is not None:
            self._console.print(line, highlight=False, markup=False, soft_wrap=True)
        else:
            self._stream().write(line + "\n")
            self._stream().flush()

    def abandon(self) -> None:
        """The phase failed or was interrupted: the started line ends here, so what follows
        (a traceback, Ctrl-C's line) starts on a line of its own."""
        if self._open:
            self._stream().write("\n")
            self._stream().flush()
            self._open = False


_LINES: contextvars.ContextVar[Lines | None] = contextvars.ContextVar("fitjax_status_lines", default=None)


def showing_on(lines: Lines | None) -> contextvars.Token:
    """Sends the status lines to `lines` (None: stdout) until `stop_showing(token)`: a bar calls
    `showing_on(Lines(self.console, live=...))` in its `setup`, `stop_showing` in its `teardown`."""
    return _LINES.set(lines)


def stop_showing(token: contextvars.Token) -> None:
    """Undoes `showing_on`."""
    _LINES.reset(token)


def _lines() -> Lines:
    return _LINES.get() or Lines()


@contextlib.contextmanager
def phase(doing: str, done: str) -> Iterator[None]:
    """One status line around a slow phase: "fitjax: <doing>…" while it runs (on a terminal),
    "fitjax: <done> in <seconds> s" when it ends."""
    lines = _lines()
    started = time.perf_counter()
    lines.start(doing)
    try:
        yield
    except BaseException:
        lines.abandon()
        raise
    lines.end(f"{done} in {time.perf_counter() - started:.1f} s")


def training_ended() -> None:
    """The fit's train batches are over (the last epoch ended, or a stop paused one): the bar
    drawn on the status console is closed now, its last state left on screen, so that what is
    printed next (a stop's line, `on_train_end`'s summaries, fit's closing line) stays below
    it; a live bar would be redrawn under each of them."""
    _lines().close()


def step_compiling(step: str) -> None:
    """The start of a step's compilation ("compiling the train step…")."""
    _lines().start(f"compiling {step}")


def step_compiled(step: str, seconds: float) -> None:
    """The end of a step's compilation, with its trace, lowering and XLA seconds."""
    _lines().end(f"compiled {step} in {seconds:.1f} s")


def step_counting(what: str) -> None:
    """The start of a compilation made only to count (XLA's FLOPs of the train step)."""
    _lines().start(f"counting {what}")


def step_counted(what: str, seconds: float) -> None:
    """The end of such a compilation: "counted the train step's FLOPs in 1.2 s"."""
    _lines().end(f"counted {what} in {seconds:.1f} s")
