"""`Watchdog`: ends a hung fit, so the scheduler frees the allocation and says where it hung.

A process stuck in a collective (a peer died or took another branch), a deadlocked data loader
or a hook waiting on a file would otherwise wait for `jax.distributed`'s heartbeat (100 s) or
forever, saying nothing. The watchdog is a thread per process; the loop only records the time
at each step's end (one clock read). When no step (nor validation batch) has ended for
`timeout` seconds, each process writes one line naming its rank and step, where the other
processes stood (read from the coordinator, when it answers), then every thread's stack; it
waits up to 3 s for the others' stacks to be written too, then exits with `exit_code` (`os._exit`: Python's exit would wait at a barrier for the hung
peers). `fitjax launch` then stops the other processes; `srun` ends the step the same way.

The clock starts at the end of the first train step, after its compilation, and pauses for
the first validation of the fit (its compilation); it stops when training ends. Any other
compilation during training (the shorter program of an epoch's leftover steps with
`steps_per_execution`) must fit in the timeout.
"""

from __future__ import annotations

import datetime
import faulthandler
import itertools
import os
import sys
import threading
import time

import jax

from fitjax.callbacks._base import Callback, ignores_batch, ignores_outputs

__all__ = ["Watchdog"]

_ASK_PEERS_S = 3.0  # how long a firing watchdog waits for the other processes' steps
_fits = itertools.count()  # the same sequence on every process: the same keys


class Watchdog(Callback):
    """Exits every process of a fit that made no progress for `timeout`, with its stacks.

    Args:
        timeout: seconds (or a `datetime.timedelta`) without a finished train step or
            validation batch, counted from the end of the first step (after compilation).
        exit_code: the status each process exits with.

    Example:
        >>> import fitjax as fj
        >>> trainer = fj.Trainer(callbacks=[fj.callbacks.Watchdog(timeout=600)])
        >>> # a rank that hangs: every rank prints "fitjax watchdog: rank 1 of 2 ..." and its stacks
    """

    def __init__(self, timeout: float | datetime.timedelta, *, exit_code: int = 1):
        if isinstance(timeout, datetime.timedelta):
            timeout = timeout.total_seconds()
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ValueError(f"Watchdog(timeout=...) takes seconds > 0 or a datetime.timedelta, got {timeout!r}")
        if isinstance(exit_code, bool) or not isinstance(exit_code, int) or not 0 < exit_code < 256:
            raise ValueError(f"Watchdog(exit_code=...) must be an int in 1..255, got {exit_code!r}")
        self.timeout = float(timeout)
        self.exit_code = exit_code
        self._last: float | None = None  # when progress was last seen; None: the clock is paused
        self._step = 0
        self._validated = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._key = ""

    # ------------------------------------------------------------------------------ hooks

    def on_fit_start(self, trainer, module) -> None:
        self._last, self._step, self._validated = None, trainer.global_step, False
        self._key = f"fitjax/watchdog/{next(_fits)}"
        self._stop.clear()
        self._thread = threading.Thread(target=self._watch, name="fitjax-watchdog", daemon=True)
        self._thread.start()

    @ignores_outputs
    @ignores_batch
    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        self._step = trainer.global_step
        self._last = time.monotonic()

    def on_validation_start(self, trainer, module) -> None:
        if self._last is not None and not self._validated:
            self._last = None  # the first validation compiles its step: not a hang

    @ignores_outputs
    @ignores_batch
    def on_validation_batch_end(self, trainer, module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        if self._thread is not None and self._step:
            self._last = time.monotonic()

    def on_validation_end(self, trainer, module) -> None:
        if self._thread is not None and self._step and not trainer.sanity_checking:
            self._validated = True
            self._last = time.monotonic()

    def on_train_end(self, trainer, module) -> None:
        self._finish()

    def teardown(self, trainer, module, stage: str) -> None:
        self._finish()  # also after an exception

    # ------------------------------------------------------------------------------ the thread

    def _finish(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)

    def _watch(self) -> None:
        check = min(1.0, self.timeout / 10)
        while not self._stop.wait(check):
            last = self._last
            if last is not None and time.monotonic() - last >= self.timeout:
                self._fire(time.monotonic() - last)

    def _fire(self, idle: float) -> None:
        rank, count = jax.process_index(), jax.process_count()
        line = (f"fitjax watchdog: rank {rank} of {count} (pid {os.getpid()}) finished no step for "
                f"{idle:.0f} s (Watchdog(timeout={self.timeout:g})); its last was step {self._step}.")
        client = _client() if count > 1 else None
        peers = self._gather(client, "step", str(self._step))
        if peers:
            steps = {r: int(s) for r, s in peers.items()}
            behind = [r for r, s in steps.items() if s == min(steps.values())]
            line += f" Last steps by rank: {steps}; behind: rank{'s' if len(behind) > 1 else ''} {behind}."
        try:
            sys.stderr.write(f"{line} Stacks of every thread follow; exiting with status {self.exit_code}.\n")
            sys.stderr.flush()
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
            sys.stdout.flush()
            # the first process to exit makes the launcher kill the rest: wait for their dumps
            self._gather(client, "dumped", "1")
        finally:
            os._exit(self.exit_code)

    def _gather(self, client, what: str, value: str) -> dict[int, str]:
        """Writes this process's `value` under `what` in the coordinator's key-value store and
        reads every process's, waiting up to `_ASK_PEERS_S` in all (each firing watchdog
        writes its own); {} with one process or when the coordinator is gone."""
        if client is None:
            return {}
        try:
            client.key_value_set(f"{self._key}/{what}/{jax.process_index()}", value)
        except Exception:  # noqa: BLE001 - the dump matters more than the peers' steps
            return {}
        deadline = time.monotonic() + _ASK_PEERS_S
        found = {}
        for r in range(jax.process_count()):
            left_ms = max(1, int((deadline - time.monotonic()) * 1000))
            try:
                found[r] = client.blocking_key_value_get(f"{self._key}/{what}/{r}", left_ms)
            except Exception:  # noqa: BLE001 - that process's watchdog has not fired (yet)
                pass
        return found


def _client():
    from fitjax._jax_compat import distributed_client  # the runtime's client: its key-value store

    return distributed_client()
