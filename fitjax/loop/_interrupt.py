"""Ctrl-C during `Trainer.fit`: Lightning's one line, the exception hooks and their checkpoint, then
exit status 130 and no traceback.

Lightning (`_call_and_handle_interrupt`) prints "Detected KeyboardInterrupt, attempting graceful
shutdown ...", ignores further Ctrl-C, runs the callbacks' `on_exception`, tears down and calls
`sys.exit(1)`. fitjax does the same with three differences:

- the status is 130, as a shell reports a process that SIGINT ended (Lightning's 1 reads as a
  failure to scripts and schedulers);
- what fit raises, `Interrupted`, is a `SystemExit` (the program ends quietly, as Lightning's) and
  a `KeyboardInterrupt` (code that catches Ctrl-C around `fit` still does);
- a further Ctrl-C says that the shutdown is saving and lets it finish, rather than nothing.

A Ctrl-C that lands while a step holds the train state (its buffers donated to the step, the new
state not yet returned) is not raised there: the loop stops once the new state is stored
(`on_sigint` in `fitjax.loop._preemption`), so the checkpoint is written from the newest state.

`FITJAX_DEBUG=1` (or `fitjax fit --debug`) prints the interrupted traceback too.

Outside a fit, from `import fitjax` on, Ctrl-C raises `Interrupted` too, without the line
(`fitjax._ctrl_c`): the script ends with 130 and no traceback whenever it lands.

A process started with SIGINT ignored (`nohup`, a shell script's `&` job) keeps ignoring it:
fit, its signal handling and generation install no SIGINT handler there (`listening`).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
import threading
import traceback
from typing import Any, Callable, Iterator

import jax

from fitjax._ctrl_c import DEBUG_VAR, Interrupted, debugging, interrupted
from fitjax._ctrl_c import held, track_collections, tracking_collections, untrack_collections

__all__ = ["DEBUG_VAR", "MESSAGE", "Interrupted", "begin", "graceful", "listening"]

MESSAGE = "Detected KeyboardInterrupt, attempting graceful shutdown ..."  # Lightning's words
SAVING = "Still shutting down: saving the checkpoint and closing the loggers, please wait ..."

log = logging.getLogger("fitjax")


class _Shutdown:
    """Whether a fit's shutdown after Ctrl-C began in this process (one fit at a time)."""
    begun = False


def begin(exc: BaseException) -> None:
    """Fit caught `exc`: for Ctrl-C, says Lightning's line (process 0; the traceback too when
    debugging) and from now until fit returns a further Ctrl-C says the shutdown is saving and
    changes nothing. Any other exception: nothing. Called once per fit's failure."""
    if not isinstance(exc, KeyboardInterrupt) or _Shutdown.begun:
        return
    _Shutdown.begun = True
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _still_saving)  # until fit returns (`graceful`)
    if debugging():
        traceback.print_exception(exc)
    if jax.process_index() == 0:
        log.info(MESSAGE)


def on_sigint(signum, frame) -> None:
    """Python's Ctrl-C (`KeyboardInterrupt`), except inside a garbage-collector callback, a
    `__del__` or anything a collection runs (weak reference callbacks), where Python would print
    it as "Exception ignored" and go on (JAX runs a callback at every collection: Ctrl-C during
    set-up was lost 1 time in 7): there the signal is sent again until it lands outside such code
    (`fitjax._ctrl_c.held`)."""
    if held(frame, quitting=_quitting):
        return
    raise KeyboardInterrupt


def _quitting() -> None:
    """A second Ctrl-C during a compilation that holds the first quits at once: Lightning's
    line is said (the shutdown that would say it does not run)."""
    if jax.process_index() == 0:
        log.info(MESSAGE)


def _still_saving(signum, frame) -> None:
    if jax.process_index() == 0:
        log.info(SAVING)


def listening() -> bool:
    """Whether fitjax may handle SIGINT here: in the main thread (Python's rule for handlers) of a
    process that does not ignore it. A process started with SIGINT ignored (`nohup`, a background
    job of a script) asked not to be stopped by Ctrl-C: taking the signal back would let a Ctrl-C
    meant for the shell that started it end the training."""
    return (threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN)


@contextlib.contextmanager
def graceful() -> Iterator[None]:
    """Around `Trainer.fit`'s body (a context, not a wrapper: warnings keep pointing at the
    user's call): a Ctrl-C anywhere in it (the argument checks and the data's set-up included)
    ends as `Interrupted` once fit's own handling (`begin`, the exception hooks, teardown) is
    done; the SIGINT handler from before fit is back when it ends."""
    handling = listening()
    previous = signal.signal(signal.SIGINT, on_sigint) if handling else None
    tracking = not tracking_collections()  # set by `import fitjax`, or a stage inside a fit: it stays
    if tracking:
        track_collections()
    try:
        yield
    except Interrupted:
        raise
    except KeyboardInterrupt as exc:
        begin(exc)  # before fit's own handling: the line is said here
        raise interrupted(announced=True, generated=getattr(exc, "generated", None)) from None
    finally:
        _Shutdown.begun = False
        if tracking:
            untrack_collections()
        if handling:  # None: a handler set from C, which Python cannot set back; its default then
            signal.signal(signal.SIGINT, signal.default_int_handler if previous is None else previous)


def exit_quietly_on_ctrl_c(main: Callable[[], Any]) -> Any:
    """Runs a console command's `main`: a Ctrl-C outside a fit (imports, parsing, a stage
    without the handling) prints Lightning's line and exits with status 130, no traceback unless
    debugging."""
    try:
        return main()
    except KeyboardInterrupt as exc:
        if getattr(exc, "announced", False):  # a fit's: its line said
            raise
        if debugging() and not isinstance(exc, Interrupted):  # (fitjax's handler printed where it landed)
            traceback.print_exception(exc)
        print(MESSAGE, file=sys.stderr)
        raise interrupted() from None
