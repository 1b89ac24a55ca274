"""`Profiler`: the interface the loop reports its phases to, and `PassThroughProfiler`, which does nothing."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any

# Nothing from fitjax.callbacks: the loop imports profilers, and callbacks sit above the loop.
from fitjax import _storage

__all__ = ["PassThroughProfiler", "Profiler"]

_NULL = contextlib.nullcontext()
_END = object()


class Profiler:
    """Where a `Trainer` reports how long its phases take (Lightning's `Profiler`).

    The loop calls `setup` when a stage starts, `profile(action)` around rare phases (building and
    compiling, validation, waiting for the device at log steps, logging), and, once per fit, wraps
    its per-step pieces: `wrap_batches` (waiting for data), `wrap_step` (dispatching the train
    step) and `wrap_hooks` (each callback hook, by name). A profiler that is off returns them
    unchanged, so the per-step path gains no work. `describe` reports when the stage ends.

    Subclasses implement `start` and `stop` (and usually `summary`).

    Args:
        dirpath: Folder of the report file; default the trainer's log dir (or `default_root_dir`).
        filename: Report file name without extension; the file is `<stage>-<filename>.txt`.

    Example:
        >>> import time
        >>> class Slowest(Profiler):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.worst, self._t = {}, {}
        ...     def start(self, action_name):
        ...         self._t[action_name] = time.perf_counter()
        ...     def stop(self, action_name):
        ...         spent = time.perf_counter() - self._t.pop(action_name)
        ...         self.worst[action_name] = max(spent, self.worst.get(action_name, 0.0))
        >>> profiler = Slowest()
        >>> with profiler.profile("[loop] validation"):
        ...     pass
        >>> list(profiler.worst)
        ['[loop] validation']
    """

    def __init__(self, dirpath: str | os.PathLike[str] | None = None, filename: str | None = None) -> None:
        self._dirpath_arg = _storage.folder(dirpath) if dirpath is not None else None
        self.dirpath = self._dirpath_arg
        self.filename = filename
        self._stage: str | None = None

    # --------------------------------------------------------------------- the interface

    def start(self, action_name: str) -> None:
        """Marks the start of `action_name`."""
        raise NotImplementedError

    def stop(self, action_name: str) -> None:
        """Marks the end of `action_name`."""
        raise NotImplementedError

    def summary(self) -> str:
        """The report, as text."""
        return ""

    @contextlib.contextmanager
    def profile(self, action_name: str) -> Iterator[None]:
        """Times the block as `action_name`."""
        self.start(action_name)
        try:
            yield
        finally:
            self.stop(action_name)

    def setup(self, stage: str, log_dir: str | os.PathLike[str] | None = None) -> None:
        """Called when `stage` ("fit", "validate", ...) starts; `log_dir` is the run's folder."""
        self._stage = stage
        self.dirpath = self._dirpath_arg or (_storage.folder(log_dir) if log_dir is not None else None)

    def describe(self) -> None:
        """Prints the report and writes it to `<dirpath>/<stage>-<filename>.txt` (process 0); a
        `dirpath` on a store (`s3://...`) is written through the file layer loggers use."""
        text = self.summary()
        if not text:
            return
        import jax

        if jax.process_index() != 0:
            return
        print(text, flush=True)
        if self.dirpath is not None:
            if not _storage.is_url(self.dirpath):  # a store has no folders to make
                self.dirpath.mkdir(parents=True, exist_ok=True)
            (self.dirpath / f"{self._stage or 'fit'}-{self.filename or 'profile'}.txt").write_text(text + "\n")

    def teardown(self, stage: str) -> None:
        """Called when `stage` ends, after `describe`."""

    # -------------------------------------------------------- per-step pieces (wrapped once)

    def wrap_step(self, step: Callable[..., Any]) -> Callable[..., Any]:
        """The train step, timed as "[step] dispatch" (the call returns before the device is done)."""
        def timed(*args: Any) -> Any:
            with self.profile("[step] dispatch"):
                return step(*args)

        return timed

    def wrap_batches(self, batches: Iterable[Any]) -> Iterator[Any]:
        """The train batches, each `next` timed as "[data] next batch" (waiting for data)."""
        iterator = iter(batches)
        while True:
            with self.profile("[data] next batch"):
                batch = next(iterator, _END)
            if batch is _END:
                return
            yield batch

    def wrap_hooks(self, hooks: Any) -> Any:
        """The loop's callback list, each hook of each callback timed as "[Callback]<class>.<hook>"."""
        return hooks.timed(self.profile)


class PassThroughProfiler(Profiler):
    """No profiling (`Trainer(profiler=None)`): every wrapper returns what it got, `profile` a no-op."""

    def start(self, action_name: str) -> None:
        pass

    def stop(self, action_name: str) -> None:
        pass

    def profile(self, action_name: str) -> contextlib.AbstractContextManager[None]:  # type: ignore[override]
        return _NULL

    def wrap_step(self, step):
        return step

    def wrap_batches(self, batches):
        return batches

    def wrap_hooks(self, hooks):
        return hooks

    def describe(self) -> None:
        pass
