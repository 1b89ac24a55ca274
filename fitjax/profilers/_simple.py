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
    (tracing, initialisation and the first compilations) and `[compile] <program>` (its count is
    the program's XLA compilations, each timed with its trace and lowering, from JAX's own compile
    events; these overlap the phases that triggered them). A phase's share is its self time (time inside it and inside no
    phase it encloses: validation's own time, not its callbacks'), so the shares with `[other]`
    (time in no phase) sum to 100%; compiles overlap the phases, so they are a block of their own,
    small programs grouped in one row. The table is printed when the stage ends and written to
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
        self.self_time: dict[str, float] = collections.defaultdict(float)  # inside it, in no phase it encloses
        self._open: list[list] = []  # [name, seconds of enclosed phases], outermost first
        self._stage_start = time.perf_counter()
        self._compiles = CompileTimes()

    def setup(self, stage, log_dir=None) -> None:
        super().setup(stage, log_dir)
        self.recorded.clear()
        self._started.clear()
        self.self_time.clear()
        self._open.clear()
        self._stage_start = time.perf_counter()
        self._compiles.__enter__()

    def teardown(self, stage: str) -> None:
        self._compiles.__exit__(None, None, None)

    def start(self, action_name: str) -> None:
        if action_name in self._started:
            raise ValueError(f"SimpleProfiler: {action_name!r} was started twice without a stop in between.")
        self._started[action_name] = time.perf_counter()
        self._open.append([action_name, 0.0])

    def stop(self, action_name: str) -> None:
        end = time.perf_counter()
        start = self._started.pop(action_name, None)
        if start is None:
            raise ValueError(f"SimpleProfiler: {action_name!r} was stopped without being started.")
        self.recorded[action_name].append(end - start)
        index = max(i for i, (name, _) in enumerate(self._open) if name == action_name)
        _, enclosed = self._open.pop(index)
        self.self_time[action_name] += max(end - start - enclosed, 0.0)
        if index > 0:  # the phase that encloses it (phases nest; an overlap counts as nested)
            self._open[index - 1][1] += end - start

    def summary(self) -> str:
        """The table: one row per phase by self time (with `[other]`, 100%), then the compiles."""
        compiles = self._compiles.take_each()
        for name, seconds in compiles.items():
            self.recorded[f"[compile] {name}"].extend(seconds)
        total = time.perf_counter() - self._stage_start
        if not self.recorded:
            return ""
        phases = [(name, self.self_time.get(name, 0.0), sum(d), len(d)) for name, d in self.recorded.items()
                  if not name.startswith("[compile] ")]
        phases.sort(key=lambda r: -r[1])
        phases.append(("[other] in no phase", max(total - sum(r[1] for r in phases), 0.0), None, None))
        compile_rows = _compile_rows(compiles)
        width = max(len("Action"), *(len(r[0]) for r in phases + compile_rows))
        header = (f"{'Action':<{width}}  | {'Mean (s)':>10} | {'Calls':>7} | {'Total (s)':>10} | {'Self (s)':>10} "
                  f"| {'% of stage':>10}")
        share = lambda seconds: 100.0 * seconds / total if total > 0 else 0.0  # noqa: E731
        lines = [f"{(self._stage or 'fit').upper()} profiler report (host wall time)", header, "-" * len(header),
                 f"{'Total':<{width}}  | {'-':>10} | {'-':>7} | {total:>10.4f} | {total:>10.4f} | {100.0:>9.1f}%"]
        for name, own, spent, calls in phases:
            if calls is None:
                lines.append(f"{name:<{width}}  | {'-':>10} | {'-':>7} | {'-':>10} | {own:>10.4f} | {share(own):>9.1f}%")
            else:
                lines.append(f"{name:<{width}}  | {spent / calls:>10.6f} | {calls:>7d} | {spent:>10.4f} | "
                             f"{own:>10.4f} | {share(own):>9.1f}%")
        if compile_rows:
            lines.append("XLA compiles (inside the phases above, not added to the 100%)")
            for name, spent, calls in compile_rows:
                lines.append(f"{name:<{width}}  | {spent / calls:>10.6f} | {calls:>7d} | {spent:>10.4f} | "
                             f"{'-':>10} | {share(spent):>9.1f}%")
        return "\n".join(lines)


def _compile_rows(compiles: dict[str, list[float]]) -> list[tuple[str, float, int]]:
    """`(name, seconds, count)` of each program that took at least 5% of all compile time, longest
    first, then one row for the rest (JAX compiles many one-op programs outside the step)."""
    total = sum(sum(d) for d in compiles.values())
    rows = sorted(((f"[compile] {n}", sum(d), len(d)) for n, d in compiles.items()), key=lambda r: -r[1])
    big = [r for r in rows if r[1] >= 0.05 * total]
    small = [r for r in rows if r[1] < 0.05 * total]
    if len(small) > 1:
        big.append((f"[compile] {len(small)} other programs", sum(r[1] for r in small), sum(r[2] for r in small)))
    else:
        big += small
    return big
