"""`python .../fitjax/cli/_run.py script.py args...`: how `fitjax launch` runs each process's script.

Run by path, so that nothing is imported before the script (not even fitjax: JAX reads its `JAX_*`
environment variables when it is first imported, and a script may set them at its top).

The script runs as `__main__` (as `python script.py` would run it), with one difference: when it
fails (an exception, or `sys.exit` with a non-zero status) the process prints the traceback and
ends at once; Ctrl-C (`KeyboardInterrupt`) prints Lightning's line instead, from process 0 only, and
ends with status 130 (the traceback too with `FITJAX_DEBUG=1`). Left to Python, the interpreter's exit would call `jax.distributed.shutdown()`,
which waits at a barrier for the other processes, and they are waiting in a collective for this
one: nothing would exit until a heartbeat timed out, and the launcher would not know to stop them.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
import traceback

# fitjax.loop._interrupt's, restated: nothing is imported before the script (a test checks they agree)
MESSAGE = "Detected KeyboardInterrupt, attempting graceful shutdown ..."
DEBUG_VAR = "FITJAX_DEBUG"


def _exit_now(status: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(status)


def _print_traceback(exc: BaseException) -> None:
    """The traceback from the script's own frames down (this module's and runpy's left out)."""
    tb = exc.__traceback__
    while tb is not None and (tb.tb_frame.f_code.co_filename == __file__
                              or "runpy" in tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb)


def main() -> None:
    args = sys.argv[1:]
    if not args:
        sys.exit("usage: python _run.py script.py [args...] | -m module [args...]")
    if args[0] == "-m":
        sys.argv = args[1:]
        sys.path[0] = os.getcwd()  # as `python -m module` sets it
        run = lambda: runpy.run_module(args[1], run_name="__main__", alter_sys=True)  # noqa: E731
    else:
        sys.argv = args
        sys.path[0] = os.path.dirname(os.path.abspath(args[0]))  # as `python script.py` sets it
        run = lambda: runpy.run_path(args[0], run_name="__main__")  # noqa: E731
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # blocked by the launcher until now
        run()
    except KeyboardInterrupt as exc:  # outside a fit; a fit's (SystemExit(130) too) said the line itself
        if not getattr(exc, "announced", False):
            if os.environ.get(DEBUG_VAR, "").strip().lower() not in ("", "0", "false", "no") \
                    and not isinstance(exc, SystemExit):  # (fitjax's own Ctrl-C printed where it landed)
                _print_traceback(exc)
            if os.environ.get("JAX_PROCESS_ID", "0") == "0":  # one line for the job, as a fit's
                print(MESSAGE, file=sys.stderr)
        _exit_now(130)  # as a shell reports a process ended by SIGINT
    except SystemExit as exc:
        if exc.code in (None, 0):
            raise  # a clean exit: Python's own shutdown, which waits for the other processes
        if not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
        _exit_now(exc.code if isinstance(exc.code, int) else 1)
    except BaseException as exc:  # noqa: BLE001 - every failure must end the process now
        _print_traceback(exc)
        _exit_now(1)


if __name__ == "__main__":
    main()
