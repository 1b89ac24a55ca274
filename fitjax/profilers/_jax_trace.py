"""`JaxProfiler`: a `jax.profiler` trace of chosen train steps, where TensorBoard's profile tab reads it."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax

from fitjax import _storage
from fitjax.profilers._base import Profiler

__all__ = ["JaxProfiler"]


def _check_count(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"JaxProfiler({name}=...) must be an int >= {minimum}; got {value!r}.")
    return value


class JaxProfiler(Profiler):
    """Traces train steps `start_step` to `start_step + num_steps - 1` with `jax.profiler`.

    The trace (host and device timelines, XLA ops, memory) lands in
    `<log dir>/plugins/profile/<timestamp>/`: `tensorboard --logdir <log dir>` shows it in the
    PROFILE tab (`pip install -e ".[profile]"` adds the plugin). Each traced step is a
    `jax.profiler.StepTraceAnnotation("train", step_num=<n>)`, so the trace viewer and the
    overview page separate steps; phases the loop reports while tracing (data waits, validation,
    logging, callbacks) appear as named host ranges. Steps count calls of the train step in this
    fit, from 0 (the first call, which also compiles: the default starts after it). Each traced
    step is waited for inside its marker, so a marker spans the step's device work and the
    profile's "Average Step Time" is the step's real time (the traced steps alone lose the
    overlap of dispatch and execution; the others run as usual).
    With several processes each traces its own into `<log dir>/process_<i>/plugins/profile/`:
    JAX names a trace file after the host, so processes sharing a host (`fitjax launch`) would
    otherwise write the same file. Under a store URL (`default_root_dir="s3://bucket/runs"`)
    the trace is written into a local folder and uploaded through the loggers' file layer
    when the last traced step ends.

    Args:
        dirpath: Folder the trace goes under (as `<dirpath>/plugins/profile/...`); default the
            trainer's log dir (or `default_root_dir`).
        start_step: The first traced call of the train step (0-based).
        num_steps: How many calls to trace.

    Example:
        >>> import fitjax as fj
        >>> trainer = fj.Trainer(max_epochs=1, profiler=fj.profilers.JaxProfiler(start_step=5, num_steps=3))
    """

    def __init__(self, dirpath: str | os.PathLike[str] | None = None, *, start_step: int = 2,
                 num_steps: int = 3) -> None:
        super().__init__(dirpath, None)
        self.start_step = _check_count("start_step", start_step, 0)
        self.num_steps = _check_count("num_steps", num_steps, 1)
        self.trace_dir: _storage.AnyPath | None = None  # the run folder of the trace, once written
        self._calls = 0
        self._tracing = False

    def setup(self, stage, log_dir=None) -> None:
        super().setup(stage, log_dir)
        self._calls = 0

    def start(self, action_name: str) -> None:
        pass  # phases are annotated through `profile`, only while the trace runs

    def stop(self, action_name: str) -> None:
        pass

    def profile(self, action_name: str) -> contextlib.AbstractContextManager[None]:  # type: ignore[override]
        return jax.profiler.TraceAnnotation(action_name) if self._tracing else contextlib.nullcontext()

    def wrap_step(self, step: Callable[..., Any]) -> Callable[..., Any]:
        first, end = self.start_step, self.start_step + self.num_steps

        def traced(*args: Any) -> Any:
            n = self._calls
            self._calls += 1
            if n < first or n >= end:
                return step(*args)
            if n == first:
                jax.block_until_ready(args)  # the steps queued before it are not its time
                self._start_trace()
            with jax.profiler.StepTraceAnnotation("train", step_num=n):
                # waited for inside the marker: a step's marker spans its device work, so the
                # profile's step-time graph shows what a step costs, not its asynchronous dispatch
                # (a sync per traced step only: the few steps being traced)
                out = jax.block_until_ready(step(*args))
            if n == end - 1:
                self._stop_trace()
            return out

        return traced

    def teardown(self, stage: str) -> None:
        self._stop_trace()  # fit ended (or failed) inside the traced steps

    def describe(self) -> None:
        if self.trace_dir is not None and jax.process_index() == 0:
            print(f"JaxProfiler: trace of train steps {self.start_step}..{self.start_step + self.num_steps - 1} "
                  f"in {self.trace_dir} (tensorboard --logdir {self.dirpath}, PROFILE tab)", flush=True)

    def _start_trace(self) -> None:
        root = self.dirpath or Path.cwd()
        if jax.process_count() > 1:  # one file name per host: a folder per process keeps them apart
            root = root / f"process_{jax.process_index()}"
        self._target = root  # where the trace ends up
        if _storage.is_url(root):  # jax.profiler writes local files: staged, uploaded at the end
            root = Path(tempfile.mkdtemp(prefix="fitjax-trace-"))
        before = set((root / "plugins" / "profile").glob("*"))
        self._root, self._before = root, before
        jax.profiler.start_trace(str(root))
        self._tracing = True

    def _stop_trace(self) -> None:
        if not self._tracing:
            return
        self._tracing = False
        jax.profiler.stop_trace()
        new = sorted(set((self._root / "plugins" / "profile").glob("*")) - self._before)
        self.trace_dir = new[-1] if new else None
        if _storage.is_url(self._target):
            _storage.put_folder(self._root, self._target)  # the staging folder holds this trace only
            shutil.rmtree(self._root, ignore_errors=True)
            if self.trace_dir is not None:
                self.trace_dir = self._target / self.trace_dir.relative_to(self._root).as_posix()
