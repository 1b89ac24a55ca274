"""The share of a profiled window the device sat idle: no program of ours running on it.

`idle_share(folder)` reads the Chrome trace (`*.trace.json.gz`) that `jax.profiler` writes, takes
the device's lane of program executions ("XLA Modules" of `/device:TPU:0` or `/device:GPU:0`),
merges overlapping intervals, and returns the window (first program start to last program end),
the busy time, the idle share, and each idle stretch over a millisecond as [start, length] in ms
from the window's start (an epoch end's checkpoint copy is one such stretch, steady steps leave
none). A CPU run has no device lane: None.
"""

from __future__ import annotations

import glob
import gzip
import json
import os
from typing import Any


def _device_events(events: list[dict], lane: str) -> list[dict]:
    """The complete events of the first device's thread named `lane` ("XLA Modules", "XLA Ops")."""
    processes = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
               if e.get("ph") == "M" and e.get("name") == "thread_name"}
    device = next((pid for pid, name in sorted(processes.items())
                   if name.startswith(("/device:TPU:0", "/device:GPU:0"))), None)
    if device is None:
        return []
    wanted = {key for key, name in threads.items() if key[0] == device and name == lane}
    return [e for e in events if e.get("ph") == "X" and e.get("pid") == device
            and (not wanted or (e["pid"], e["tid"]) in wanted)]


def _newest_events(folder: str) -> list[dict] | None:
    """The events of the newest Chrome trace under `folder`, or None when there is none."""
    files = sorted(glob.glob(os.path.join(folder, "**", "*.trace.json.gz"), recursive=True))
    if not files:
        return None
    with gzip.open(files[-1]) as file:
        return json.load(file)["traceEvents"]


def op_times(folder: str, top: int = 40) -> list[dict[str, Any]] | None:
    """The device's time per operation over a trace, largest first: what a step spends where.

    Each entry: the op's name, its total microseconds and count in the window, and the HLO text
    the trace gives for it (`long_name`, cut short), so two programs' traces can be set side by
    side (their fusion names differ; their HLO does not)."""
    events = _newest_events(folder)
    if events is None:
        return None
    ops = _device_events(events, "XLA Ops")
    totals: dict[str, dict[str, Any]] = {}
    for e in ops:
        entry = totals.setdefault(e["name"], {"name": e["name"], "us": 0.0, "count": 0,
                                              "hlo": str(e.get("args", {}).get("long_name", ""))[:300]})
        entry["us"] += e["dur"]
        entry["count"] += 1
    return sorted(totals.values(), key=lambda entry: -entry["us"])[:top]


def device_lane(folder: str) -> list[tuple[float, float]]:
    """The device's program executions in the newest trace under `folder`, as sorted [start, end]
    in µs; empty without a trace or a device lane (a CPU run)."""
    events = _newest_events(folder)
    return [] if events is None else sorted((e["ts"], e["ts"] + e["dur"])
                                            for e in _device_events(events, "XLA Modules"))


def device_lane_named(folder: str) -> list[tuple[str, float, float]]:
    """`device_lane` with each program's name: sorted (name, start, end) in µs."""
    events = _newest_events(folder)
    return [] if events is None else sorted(((e["name"], e["ts"], e["ts"] + e["dur"])
                                             for e in _device_events(events, "XLA Modules")), key=lambda x: x[1])


def steady_window(first: int, per_epoch: int, steps: int) -> int:
    """The first of `steps` optimizer steps to trace, from `first` on, whose window holds no epoch
    end (an epoch end's work is not a steady step's: the default checkpoint's copy to host memory,
    the next epoch's first batches); `first` itself where epochs are too short to hold the window.
    The window runs from the end of step `first` to the end of step `first + steps`; the epoch
    ends after steps `per_epoch`, `2 * per_epoch`, ..."""
    ends_inside = (first + steps - 1) // per_epoch * per_epoch >= first
    return (first // per_epoch + 1) * per_epoch + 1 if ends_inside and per_epoch > steps + 1 else first


GAP_US = 1000  # idle stretches longer than this are listed: where in the window the device waited


def idle_share(folder: str) -> dict[str, Any] | None:
    return idle_of(device_lane(folder))


def idle_of(intervals: list[tuple[float, float]]) -> dict[str, Any] | None:
    """`idle_share` of a device lane already read (`device_lane`)."""
    if not intervals:
        return None
    busy, (start, end), gaps = 0.0, intervals[0], []
    for begin, finish in intervals[1:]:
        if begin > end:
            busy += end - start
            if begin - end > GAP_US:
                gaps.append([round((end - intervals[0][0]) / 1e3, 3), round((begin - end) / 1e3, 3)])
            start, end = begin, finish
        else:
            end = max(end, finish)
    busy += end - start
    window = intervals[-1][1] - intervals[0][0]
    return {"window_s": window / 1e6, "busy_s": busy / 1e6, "idle_share": 1 - busy / window if window else 0.0,
            "programs": len(intervals), "gaps_ms": gaps}
