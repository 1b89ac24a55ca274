"""Where the test suite's time goes: each test's wall time, its worker's CPU and its children's.

A pytest plugin. Run README's test command with it and read the summary:

    PYTHONPATH=benchmarks SUITE_CPU=/tmp/suite-cpu python -m pytest tests -n 4 --dist loadgroup -p _suite_cpu
    python benchmarks/_suite_cpu.py /tmp/suite-cpu        # per worker and per file, heaviest first

Each worker writes `rows-<worker>.json` into `$SUITE_CPU`: per test its node id, wall seconds,
the worker process's CPU seconds (all its threads) and its waited-for children's CPU seconds
(launched processes, scripts; not servers started by fixtures), and when it ended. Wall time
beyond the two CPU figures is waiting (on a process, a server, a sleep) or, on a busy machine,
waiting for a core.
"""

from __future__ import annotations

import collections
import json
import os
import resource
import sys
import time
from pathlib import Path

_rows: list = []


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def pytest_runtest_protocol(item, nextitem):  # noqa: ARG001 (pytest's hook signature)
    _rows.append([item.nodeid, time.perf_counter(), _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN)])


def pytest_runtest_logfinish(nodeid, location):  # noqa: ARG001
    if _rows and _rows[-1][0] == nodeid and len(_rows[-1]) == 4:
        row = _rows[-1]
        row[1:] = [time.perf_counter() - row[1], _cpu(resource.RUSAGE_SELF) - row[2],
                   _cpu(resource.RUSAGE_CHILDREN) - row[3], time.time()]


def pytest_sessionfinish(session):  # noqa: ARG001
    folder = os.environ.get("SUITE_CPU")
    if folder and _rows:
        Path(folder).mkdir(parents=True, exist_ok=True)
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        (Path(folder) / f"rows-{worker}.json").write_text(json.dumps([r for r in _rows if len(r) == 5]))


def summary(folder: str, top: int = 40) -> None:
    workers = {path.stem[5:]: rows for path in sorted(Path(folder).glob("rows-*.json"))
               if (rows := json.loads(path.read_text()))}  # the controller of workers runs no test
    start = min(end - wall for rows in workers.values() for _, wall, _, _, end in rows)
    print("worker   tests   wall s    cpu s  child s  ends at s")
    for name, rows in workers.items():
        print(f"{name:8} {len(rows):5} {sum(r[1] for r in rows):8.0f} {sum(r[2] for r in rows):8.0f} "
              f"{sum(r[3] for r in rows):8.0f} {max(r[4] for r in rows) - start:10.0f}")
    files = collections.defaultdict(lambda: [0.0, 0.0, 0.0, 0])
    for rows in workers.values():
        for nodeid, wall, cpu, child, _ in rows:
            entry = files[nodeid.split("::")[0]]
            entry[0] += wall
            entry[1] += cpu
            entry[2] += child
            entry[3] += 1
    print("\n  wall s    cpu s  child s  tests  file (heaviest CPU first)")
    for file, (wall, cpu, child, n) in sorted(files.items(), key=lambda kv: -(kv[1][1] + kv[1][2]))[:top]:
        print(f"{wall:8.1f} {cpu:8.1f} {child:8.1f} {n:6}  {file}")


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1].startswith("-"):
        print(__doc__)
        sys.exit(0 if sys.argv[1:] in (["-h"], ["--help"]) else 2)
    summary(sys.argv[1])
