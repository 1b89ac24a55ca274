"""XLA's cost of a compiled program with each loop body counted once per iteration.

XLA's cost analysis (`compiled.cost_analysis()`) counts a `while` loop's body once, however many
times it runs: a model whose blocks are one `nn.scan`, or a step scanning over micro-batches,
reports one iteration's FLOPs and bytes. `per_iteration` adds the rest. The compiled program's
HLO text is parsed back; each loop body's cost is XLA's own analysis of that body (made the entry
computation of a module of its own with what it calls), and a body that runs `n` times adds
`n - 1` more of it, nested loops multiplied through. The trip count is the one XLA recorded (`known_trip_count`:
XLA:CPU, GPU), else read from the loop: `i < N` in its condition, `i` starting from a constant
and stepping by a constant in its body (what `lax.scan` and `fori_loop` lower to; XLA:TPU records
none). A loop whose count cannot be read stays counted once, as XLA counts it. Loops are not
only the user's: XLA:TPU splits large sharded matmuls into loops of its own (73 of them, 4 trips
each, in GPT-2 small's fsdp step: XLA's count 2.06 TFLOP a chip, 2.58 TFLOP counted per
iteration, the same as 6N + attention).

The bodies are analysed with this machine's CPU client (a TPU program's HLO parses the same; its
FLOPs are counted alike, its bytes without the TPU's tile padding): the difference between that
analysis with and without the repeats is what is added to the compiled program's own figures.
A program without loops keeps XLA's figures exactly. Reading costs ~0.1 s a MB of HLO text, and
a few ms a loop body.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import jax

__all__ = ["per_iteration", "trip_counts"]

_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_OPCODE = re.compile(r"\s*([\w\-]+)\(")
_WHILE = re.compile(r"\bwhile\(.*?condition=%?([\w.\-]+),\s*body=%?([\w.\-]+)")
_KNOWN_TRIP = re.compile(r'known_trip_count[^0-9]*(\d+)')
_CALLED = re.compile(r"(?:calls|to_apply|branch_computations|called_computations)=\{?([%\w.\-, ]+)\}?")
_OPERANDS = re.compile(r"%([\w.\-]+)")
_PASS_THROUGH = ("copy", "bitcast", "convert", "reshape")
_STACK_FRAME = re.compile(r"\s*stack_frame_id=\d+")


@dataclasses.dataclass
class _Computation:
    name: str
    start: int  # the header's line number
    end: int = -1  # the closing brace's
    lines: dict[str, str] = dataclasses.field(default_factory=dict)  # instruction -> text after '='
    root: str | None = None
    #: (instruction, condition, body) of each loop it runs
    loops: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)
    #: the other computations it runs once per call (fusions, calls, branches, reducers)
    calls: list[str] = dataclasses.field(default_factory=list)


def _parse(hlo_text: str) -> tuple[dict[str, _Computation], str | None]:
    computations: dict[str, _Computation] = {}
    entry, current = None, None
    for number, line in enumerate(hlo_text.splitlines()):
        header = _HEADER.match(line)
        if header and "=" not in line.split("{")[0].split("(")[0]:
            current = computations[header.group(2)] = _Computation(header.group(2), number)
            if header.group(1):
                entry = current.name
            continue
        if current is None:
            continue
        if line.strip() == "}":
            current.end = number
            current = None
            continue
        instruction = _INSTRUCTION.match(line)
        if not instruction:
            continue
        name, text = instruction.group(2), instruction.group(3)
        current.lines[name] = text
        if instruction.group(1):
            current.root = name
        loop = _WHILE.search(text)
        if loop and _opcode(text) == "while":
            current.loops.append((name, loop.group(1), loop.group(2)))
            continue
        for called in _CALLED.findall(text):
            current.calls.extend(n.strip().lstrip("%") for n in called.split(",") if n.strip())
    return computations, entry


def _opcode_at(text: str) -> re.Match | None:
    """The opcode after an instruction's result type (a shape, or a tuple of them in parentheses)."""
    end = 0
    if text.startswith("("):
        depth = 0
        for end, char in enumerate(text):
            depth += {"(": 1, ")": -1}.get(char, 0)
            if depth == 0:
                break
        end += 1
    else:
        end = text.find(" ")
    return _OPCODE.match(text, max(end, 0))


def _opcode(text: str) -> str | None:
    found = _opcode_at(text)
    return found.group(1) if found else None


def _operands(text: str) -> list[str]:
    """The instruction names in an instruction's operand list."""
    found = _opcode_at(text)
    if not found:
        return []
    inside = text[found.end():]  # just after the opcode's opening parenthesis
    depth, end = 1, 0
    for end, char in enumerate(inside):  # up to the operand list's closing parenthesis
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0:
            break
    return _OPERANDS.findall(inside[:end])


def _constant(computation: _Computation, name: str, depth: int = 0) -> int | None:
    """The integer a scalar instruction holds, following copies; None when it is not a constant."""
    text = computation.lines.get(name)
    if text is None or depth > 8:
        return None
    op = _opcode(text)
    if op == "constant":
        value = re.search(r"constant\((-?\d+)\)", text)
        return int(value.group(1)) if value else None
    if op in _PASS_THROUGH:
        operands = _operands(text)
        return _constant(computation, operands[0], depth + 1) if len(operands) == 1 else None
    return None


def _tuple_index(computation: _Computation, name: str, depth: int = 0) -> int | None:
    """`i` when `name` is `get-tuple-element(<the computation's parameter>), index=i` (or a copy of it)."""
    text = computation.lines.get(name, "")
    operands = _operands(text)
    if _opcode(text) in _PASS_THROUGH and len(operands) == 1 and depth < 8:
        return _tuple_index(computation, operands[0], depth + 1)
    if _opcode(text) != "get-tuple-element":
        return None
    if len(operands) != 1 or _opcode(computation.lines.get(operands[0], "")) != "parameter":
        return None
    index = re.search(r"index=(\d+)", text)
    return int(index.group(1)) if index else None


def _trip_count(computations: dict[str, _Computation], caller: _Computation, loop: tuple[str, str, str]
                ) -> int | None:
    instruction, condition_name, body_name = loop
    text = caller.lines[instruction]
    known = _KNOWN_TRIP.search(text)
    if known:
        return int(known.group(1))
    condition, body = computations.get(condition_name), computations.get(body_name)
    if condition is None or body is None or condition.root is None or body.root is None:
        return None
    compare = condition.lines[condition.root]
    direction = re.search(r"direction=(LT|LE|GT|GE)", compare)
    operands = _operands(compare)
    if _opcode(compare) != "compare" or not direction or len(operands) != 2:
        return None
    (counter, bound), flip = operands, False
    if _tuple_index(condition, counter) is None:  # `N > i` written the other way round
        (bound, counter), flip = operands, True
    index, limit = _tuple_index(condition, counter), _constant(condition, bound)
    if index is None or limit is None:
        return None
    # the counter's start: element `index` of the loop's initial tuple, a constant
    initial = _operands(text)
    if len(initial) != 1 or _opcode(caller.lines.get(initial[0], "")) != "tuple":
        return None
    elements = _operands(caller.lines[initial[0]])
    start = _constant(caller, elements[index]) if index < len(elements) else None
    # its step: element `index` of the body's result is `add(that element, constant)`
    results = _operands(body.lines[body.root]) if _opcode(body.lines[body.root]) == "tuple" else []
    step = None
    if index < len(results) and _opcode(body.lines.get(results[index], "")) == "add":
        added = _operands(body.lines[results[index]])
        if len(added) == 2 and index in (_tuple_index(body, added[0]), _tuple_index(body, added[1])):
            step = _constant(body, added[1]) if _tuple_index(body, added[0]) == index else _constant(body, added[0])
    if start is None or not step:
        return None
    op = direction.group(1)
    if flip:
        op = {"LT": "GT", "LE": "GE", "GT": "LT", "GE": "LE"}[op]
    if op in ("LT", "LE") and step > 0:
        return max(0, math.ceil((limit + (op == "LE") - start) / step))
    if op in ("GT", "GE") and step < 0:
        return max(0, math.ceil((start - limit - (op == "GE")) / -step))
    return None


def trip_counts(hlo_text: str) -> dict[str, int]:
    """Computation name -> how many times it runs per call of the entry computation (loops'
    trip counts multiplied through; a loop whose count cannot be read counted once)."""
    computations, entry = _parse(hlo_text)
    times: dict[str, int] = {}

    def visit(name: str, factor: int, depth: int = 0) -> None:
        computation = computations.get(name)
        if computation is None or depth > 50:
            return
        times[name] = times.get(name, 0) + factor
        for called in computation.calls:
            visit(called, factor, depth + 1)
        for loop in computation.loops:
            visit(loop[1], factor, depth + 1)
            trips = _trip_count(computations, computation, loop)
            visit(loop[2], factor * (1 if trips is None else trips), depth + 1)

    if entry is not None:
        visit(entry, 1)
    return times


_KEYS = ("flops", "bytes accessed", "transcendentals")


def _client():
    try:
        return jax.local_devices(backend="cpu")[0].client
    except RuntimeError:  # no CPU backend in this process (JAX_PLATFORMS without cpu)
        return None


def _analysis(client, lines: list[str], computations: dict[str, _Computation], entry: str) -> dict[str, float]:
    """XLA's cost analysis of computation `entry` (a loop's body) as the entry of a module of its own:
    it and what it calls, in the program's order (callees first), each loop in it counted once."""
    from jaxlib import _hlo

    from fitjax._jax_compat import hlo_module_cost_analysis

    needed: set[str] = set()

    def reach(name: str) -> None:
        if name in needed or name not in computations:
            return
        needed.add(name)
        computation = computations[name]
        for called in computation.calls:
            reach(called)
        for _, condition, body in computation.loops:
            reach(condition)
            reach(body)

    reach(entry)
    text = [lines[0].split(",")[0]]  # "HloModule <name>": the old entry's layout and aliases go
    for computation in sorted((computations[n] for n in needed), key=lambda c: c.start):
        block = lines[computation.start:computation.end + 1]
        header = block[0][len("ENTRY "):] if block[0].startswith("ENTRY ") else block[0]
        text += [("ENTRY " if computation.name == entry else "") + header, *block[1:]]
    # stack frames index a table the new module lacks (XLA would warn for each)
    module = _hlo.hlo_module_from_text(_STACK_FRAME.sub("", "\n".join(text)))
    cost = hlo_module_cost_analysis(client, module)
    return {key: float(cost.get(key, 0.0)) for key in _KEYS}


def per_iteration(hlo_text: str, cost: dict[str, float]) -> dict[str, float]:
    """`cost` (a compiled program's `cost_analysis()` as floats) with `flops`, `bytes accessed`
    and `transcendentals` counting each loop body once per iteration (see the module). Unchanged
    when the program has no loop whose count is read, or when its HLO cannot be analysed here."""
    computations, entry = _parse(hlo_text)
    if entry is None or not any(c.loops for c in computations.values()):
        return cost
    client = _client()
    if client is None:
        return cost
    lines = hlo_text.splitlines()
    once: dict[str, dict[str, float]] = {}  # body -> XLA's count of one call of it (inner loops once)
    beyond: dict[str, dict[str, float]] = {}

    def counted(name: str) -> dict[str, float]:
        if name not in once:
            once[name] = _analysis(client, lines, computations, name)
        return once[name]

    def extra(name: str, depth: int = 0) -> dict[str, float]:
        """What one call of `name` costs beyond XLA's count of it: its loops' repeats."""
        if name in beyond:
            return beyond[name]
        added = beyond[name] = dict.fromkeys(_KEYS, 0.0)
        computation = computations.get(name)
        if computation is None or depth > 50:
            return added
        for loop in computation.loops:
            trips = _trip_count(computations, computation, loop)
            trips = 1 if trips is None else trips
            inner = extra(loop[2], depth + 1)
            for key in _KEYS:  # n (once + inner) - once
                added[key] += (trips - 1) * counted(loop[2])[key] if trips != 1 else 0.0
                added[key] += trips * inner[key]
        for called in computation.calls:
            for key, value in extra(called, depth + 1).items():
                added[key] += value
        return added

    try:
        added = extra(entry)
    except Exception:  # noqa: BLE001 - a module this jaxlib cannot parse back: XLA's own figures
        return cost
    out = dict(cost)
    for key, value in added.items():
        if value and key in out:
            out[key] = out[key] + value
    return out
