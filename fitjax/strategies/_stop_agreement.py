"""Stopping every process after the same step, within a step or two of a signal, at no per-step cost.

A signal (SIGTERM, SLURM's requeue signal) reaches each process at its own step, or only one
of them. Comparing a flag with a collective at every step would cost a host sync per step; at
log steps only, it comes too late (50 steps of 1 s outlast SLURM's 30 s grace). This is the
protocol of JAX's preemption sync point (`multihost_utils.reached_preemption_sync_point`),
written over `jax.distributed`'s key-value store so that any signal, not just SIGTERM, can start
it, and so that it carries why the run stops:

1. The process that got the request writes a notice key (the first writer wins: one reason).
2. A thread in every process waits for that key (a blocking read on the coordinator: nothing
   per step). When it appears, the thread marks the notice seen, then publishes the last step
   its loop passed, and reads every process's.
3. The stop step is the largest published step + 1. A loop that sees the notice waits (a few
   milliseconds, once) until the stop step is known, so it cannot pass it; the threads agree
   without the loops, so a loop waiting in a collective for a slower one does not block them.

Per step the loop writes one attribute and reads two (well under a microsecond:
`benchmarks/stop_agreement.py`). With one process no thread runs: a request stops after the
next step. Costs a few key-value round trips once per stop, and two keys per fit.
"""

from __future__ import annotations

import itertools
import logging
import threading

import jax

__all__ = ["StopAgreement"]

log = logging.getLogger("fitjax")

_END = "<fit ended>"  # the notice a process writes when its fit ends without a stop
_POLL_MS = 60_000  # the watcher's blocking read is renewed this often (no cost in between)
_EXCHANGE_MS = 120_000  # how long the threads wait for each other's steps before giving up
_fits = itertools.count()  # every process runs its fits in the same order: the same keys


def _client():
    from fitjax._jax_compat import distributed_client  # the runtime's client: its key-value store

    return distributed_client()


class StopAgreement:
    """One fit's stop requests, agreed by every process on one step.

    Call `request(reason)` from anywhere (a signal handler: it only sets an attribute), and
    `reached(step)` from the loop after each step on every process, with the same increasing
    steps on each; it returns the agreed reason at the agreed step, else None. `close()` when
    the fit ends.

    Example:
        >>> agreement = StopAgreement()
        >>> agreement.request("SIGTERM")
        >>> agreement.reached(step=1)   # one process: the next step stops
        'SIGTERM'
        >>> agreement.close()
    """

    def __init__(self) -> None:
        self.requested: str | None = None  # this process's own request (a signal's name, ...)
        self._announced = False
        self._step = -1  # the last step the loop passed (read by the watcher thread)
        self._notice: str | None = None  # the agreed reason, once the notice is seen here
        self._target: int | None = None  # the agreed stop step
        self._error: BaseException | None = None
        self._decided = threading.Event()
        client = _client() if jax.process_count() > 1 else None
        self._client = client
        self._thread: threading.Thread | None = None
        if client is not None:
            self._key = f"fitjax/stop/{next(_fits)}"
            self._thread = threading.Thread(target=self._watch, name="fitjax-stop-agreement", daemon=True)
            self._thread.start()

    def request(self, reason: str) -> None:
        """Asks every process to stop after an agreed step; safe inside a signal handler."""
        if self.requested is None:
            self.requested = reason

    def reached(self, step: int) -> str | None:
        """The agreed reason when the loop, having finished `step`, must stop now; else None."""
        if self._client is None:
            return self.requested
        if self.requested is not None and not self._announced:
            self._announce()
        self._step = step  # written before the notice is read; the watcher does the reverse
        if self._notice is None:
            return None
        if not self._decided.wait(_EXCHANGE_MS / 1000 + 10):
            raise RuntimeError("the processes did not agree on a stop step within "
                               f"{_EXCHANGE_MS / 1000:.0f} s of the notice {self._notice!r}")
        if self._error is not None:
            raise RuntimeError(f"agreeing on a stop step failed: {self._error}") from self._error
        return self._notice if step >= self._target else None

    @property
    def stop_step(self) -> int | None:
        """The agreed stop step, once known (None with one process)."""
        return self._target

    def close(self) -> None:
        """Ends this fit's agreement: a notice not yet written can no longer be."""
        if self._client is None:
            return
        self._set_notice(_END)  # wakes every process's watcher, unless a stop was noticed first
        self._thread.join(timeout=_EXCHANGE_MS / 1000 + 10)

    # ------------------------------------------------------------------------ the protocol

    def _announce(self) -> None:
        self._announced = True
        self._set_notice(self.requested)

    def _set_notice(self, value: str) -> None:
        try:
            self._client.key_value_set(f"{self._key}/notice", value)
        except Exception as error:  # noqa: BLE001 - ALREADY_EXISTS: the first notice stands
            if "ALREADY_EXISTS" not in str(error) and "already exists" not in str(error).lower():
                log.warning("fitjax: could not write the stop notice %r: %s", value, error)

    def _watch(self) -> None:
        client, rank = self._client, jax.process_index()
        try:
            while True:
                try:
                    notice = client.blocking_key_value_get(f"{self._key}/notice", _POLL_MS)
                    break
                except Exception as error:  # noqa: BLE001 - a renewal, or the runtime is gone
                    if "DEADLINE_EXCEEDED" not in str(error):
                        raise
            if notice == _END:
                return
            self._notice = notice  # seen first, then the step read: the loop cannot pass it
            client.key_value_set(f"{self._key}/step/{rank}", str(self._step))
            steps = [int(client.blocking_key_value_get(f"{self._key}/step/{r}", _EXCHANGE_MS))
                     for r in range(jax.process_count())]
            self._target = max(steps) + 1
        except BaseException as error:  # noqa: BLE001 - raised on the loop's thread instead
            self._error = error
        finally:
            self._decided.set()
