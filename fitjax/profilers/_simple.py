"""`SimpleProfiler`: host wall time per phase of the loop, as a table when the stage ends."""

from __future__ import annotations

import collections
import os
import time

from fitjax.profilers._base import Profiler
from fitjax.profilers._compile import CompileTimes

__all__ = ["SimpleProfiler"]


class SimpleProfiler(Profiler):
    """Host wall time of each phase: count, mean and total, and its share of the stage's time.

    Phases (`Trainer(profiler="simple")`): `[data] next batch` (waiting for data),
    `[step] dispatch` (handing the train step to the device: it returns before the device is
    done), `[sync] log step values` (waiting for the device where the loop reads values),
    `[Callback]<name>.<hook>` and `[LitModule]<name>.<hook>` (checkpoint saves show as
    ModelCheckpoint's hooks), `[log] loggers`, `[loop] validation`, `[build] state and programs`
    (tracing, initialisation and the first compilations) and `[compile] <program>` (each XLA
    program's trace, lowering and compilation, from JAX's own compile events; these overlap the
    phases that triggered them). The table is printed when the stage ends and written to
    `<log dir>/fit-profile.txt`. Device time is not host time: the device may still be busy when
    `[step] dispatch` returns; `Trainer(profiler="jax")` shows the device.

    Args:
        dirpath: Folder of the report file; default the trainer's log dir (or `default_root_dir`).
        filename: Report file name without extension (default "profile").

    Example:
        >>> import fitjax as fj
        >>> trainer = fj.Trainer(max_epochs=1, profiler="simple")
        >>> # trainer.fit(module, data)  -> the table below, also in <log_dir>/fit-profile.txt
        >>> profiler = fj.profilers.SimpleProfiler()
        >>> with profiler.profile("my phase"):
        ...     pass
        >>> profiler.recorded["my phase"][0] >= 0
        True
    """

    def __init__(self, dirpath: str | os.PathLike[str] | None = None, filename: str | None = None) -> None:
        super().__init__(dirpath, filename)
        self.recorded: dict[str, list[float]] = collections.defaultdict(list)
        self._started: dict[str, float] = {}
        self._stage_start = time.perf_counter()
        self._compiles = CompileTimes()

    def setup(self, stage, log_dir=None) -> None:
        super().setup(stage, log_dir)
        self.recorded.clear()
        self._started.clear()
        self._stage_start = time.perf_counter()
        self._compiles.__enter__()

    def teardown(self, stage: str) -> None:
        self._compiles.__exit__(None, None, None)

    def start(self, action_name: str) -> None:
        if action_name in self._started:
            raise ValueError(f"SimpleProfiler: {action_name!r} was started twice without a stop in between.")
        self._started[action_name] = time.perf_counter()

    def stop(self, action_name: str) -> None:
        end = time.perf_counter()
        start = self._started.pop(action_name, None)
        if start is None:
            raise ValueError(f"SimpleProfiler: {action_name!r} was stopped without being started.")
        self.recorded[action_name].append(end - start)

    def summary(self) -> str:
        """The table: one row per phase, the longest total first, and the stage's total."""
        for name, seconds in self._compiles.take_each().items():
            self.recorded[f"[compile] {name}"].extend(seconds)
        total = time.perf_counter() - self._stage_start
        if not self.recorded:
            return ""
        rows = sorted(((name, sum(d), len(d)) for name, d in self.recorded.items()), key=lambda r: -r[1])
        width = max(len("Action"), *(len(r[0]) for r in rows))
        header = f"{'Action':<{width}}  | {'Mean (s)':>10} | {'Calls':>7} | {'Total (s)':>10} | {'% of stage':>10}"
        lines = [f"{(self._stage or 'fit').upper()} profiler report (host wall time)", header, "-" * len(header),
                 f"{'Total':<{width}}  | {'-':>10} | {'-':>7} | {total:>10.4f} | {100.0:>9.1f}%"]
        for name, spent, calls in rows:
            lines.append(f"{name:<{width}}  | {spent / calls:>10.6f} | {calls:>7d} | {spent:>10.4f} | "
                         f"{100.0 * spent / total if total > 0 else 0.0:>9.1f}%")
        return "\n".join(lines)
