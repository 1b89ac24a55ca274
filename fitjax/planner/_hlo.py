"""The collectives of a compiled program and the bytes each moves, read from its HLO text.

Each collective instruction's result shape gives the data it handles; its replica groups give
how many devices share it. Bytes on the wire per device follow the ring algorithms (an
all-reduce sends `2 (n-1)/n` of its data, an all-gather or reduce-scatter `(n-1)/n` of the
gathered/scattered whole, a permute all of it). An instruction inside a loop body (a `lax.scan`
over micro-batches) runs once per iteration: its bytes are multiplied by the loop's trip count
as XLA recorded it (`known_trip_count`) or as the loop's condition and counter give it
(`fitjax.step.hlo_loops`: XLA:TPU records none).

One collective is counted once, however many instructions XLA:TPU writes for it: its async
collective fusion copies an all-gather (the same `channel_id`) into each fusion that consumes
its data as it arrives (measured: a 2-layer Llama's step for `tpu-v5e-8` under fsdp × tensor
holds 92-107 all-gather instructions of 28 channels), and how many copies it makes changes with
the schedule, not with what moves.
"""

from __future__ import annotations

import math
import re
from typing import NamedTuple

from fitjax.step import hlo_loops

__all__ = ["Collective", "collectives"]

_KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_INSTRUCTION = re.compile(
    r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(?P<type>.+?)\s+(?P<op>" + "|".join(_KINDS) + r")(?P<start>-start)?\(",
)
_SHAPE = re.compile(r"\b(pred|bf16|f8e\w+|c64|c128|[suf]\d+)\[([\d,]*)\]")
_CHANNEL = re.compile(r"\bchannel_id=(\d+)")
_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")


class Collective(NamedTuple):
    """One kind of collective over the whole program."""

    kind: str
    #: instructions of this kind executed per call (loop bodies counted per iteration)
    count: int
    #: bytes of the data these collectives handle (their results; a reduce-scatter's input)
    bytes: int
    #: bytes each device sends for them (ring algorithms)
    wire_bytes: float


def _bits(dtype: str) -> int:
    if dtype == "pred":
        return 8
    if dtype.startswith("f8"):
        return 8
    return int(re.match(r"[a-z]+(\d+)", dtype).group(1))


def _type_bytes(text: str, *, largest: bool) -> int:
    sizes = [math.prod(int(d) for d in dims.split(",") if d) * _bits(dtype) // 8
             for dtype, dims in _SHAPE.findall(text)]
    if not sizes:
        return 0
    return max(sizes) if largest else sum(sizes)


def _group_size(line: str, devices: int) -> int:
    """Devices in each replica group of an instruction (all of them when it names none)."""
    iota = re.search(r"replica_groups=\[(\d+),(\d+)\]<=", line)
    if iota:
        return int(iota.group(2))
    listed = re.search(r"replica_groups=\{\{([\d,]*)\}", line)
    if listed:
        return max(1, len([d for d in listed.group(1).split(",") if d]))
    mesh = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", line)
    if mesh:
        sizes = dict(re.findall(r"'([^']+)'=(\d+)", mesh.group(1)))
        return math.prod(int(sizes.get(axis, 1)) for axis in re.findall(r"'([^']+)'", mesh.group(2)))
    pairs = re.search(r"source_target_pairs=\{(.*?)\}\}", line)
    if pairs:
        return 2
    return devices


def collectives(hlo_text: str, devices: int) -> dict[str, Collective]:
    """The collectives of a compiled program's HLO (`compiled.as_text()`) by kind, for a program
    over `devices` devices; kinds that do not occur are left out."""
    times = hlo_loops.trip_counts(hlo_text)
    # one collective -> [runs per call, bytes, wire bytes per run]
    seen: dict[tuple, list[float]] = {}
    current = None
    for number, line in enumerate(hlo_text.splitlines()):
        header = _COMPUTATION.match(line)
        if header and "=" not in line.split("{")[0]:
            current = header.group(1)
            continue
        match = _INSTRUCTION.match(line)
        if not match:
            continue
        kind, type_text = match.group("op"), match.group("type")
        # an async start's type is (operands, results[, context]): the largest array is the data
        size = _type_bytes(type_text, largest=bool(match.group("start")) or kind == "all-gather")
        n = _group_size(line, devices)
        if kind == "reduce-scatter":
            size *= n
        factor = {"all-reduce": 2 * (n - 1) / n, "collective-permute": 1.0}.get(kind, (n - 1) / n) if n > 1 else 0.0
        repeat = max(1, times.get(current, 1)) if current else 1
        channel = _CHANNEL.search(line)
        # XLA's copies of one collective share its channel and its shapes (not always their layouts'
        # memory spaces); the compiler's own `all-reduce-scatter` helper computations each number
        # their channels from 1: their shapes tell them apart
        key = (kind, channel.group(1), tuple(_SHAPE.findall(type_text))) if channel else (kind, number)
        entry = seen.setdefault(key, [0, size, size * factor])
        entry[0] = max(entry[0], repeat)  # a copy in a loop's body runs as often as the loop
    found: dict[str, list[float]] = {}
    for (kind, *_), (repeat, size, wire) in seen.items():
        entry = found.setdefault(kind, [0, 0, 0.0])
        entry[0] += repeat
        entry[1] += size * repeat
        entry[2] += wire * repeat
    return {kind: Collective(kind, int(c), int(b), float(w)) for kind, (c, b, w) in found.items()}
