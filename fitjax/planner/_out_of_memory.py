"""Out of memory, explained: what the step needs, what the device has, and the cheapest change
the planner finds that fits.

When XLA refuses a step for memory (`RESOURCE_EXHAUSTED`: XLA:TPU as it compiles, "Ran out of
memory in memory space hbm. Used 20.5G of 15.48G hbm"; any backend as it allocates, "Attempting
to reserve 8.95G at the bottom of memory. ... There are 6.43G free"), or a memory budget
(`PlannedStrategy(memory_bytes=...)`) is under every strategy's peak, `out_of_memory_error`
builds the error fitjax raises: XLA's own figures (`xla_figures`), then the planner's search
for the cheapest change that fits, one kind of change at a time, cheapest first, stopping at the
first that fits:

1. another strategy over the same devices (dp, ZeRO-1, fsdp, ...: the same FLOPs);
2. smaller micro-batches with gradient accumulation (the same rows per optimizer step, the same
   FLOPs; k = 2, 4, 8 times the trainer's);
3. Adam's moments stored narrower (`fj.optim.adamw(..., moments="bfloat16")`, then `"int8"`:
   the same FLOPs, the moments rounded between steps), where the optimizer is an Adam whose
   moments are wider;
4. activation rematerialization (`remat="full"`: about a third more FLOPs), then with those
   micro-batches.

Each candidate is the train step compiled and measured (`measure`: XLA's memory analysis, never
run), so the answer costs one compilation per candidate tried, paid only when the step failed.
A change of the moments is priced without compiling (the optimizer is the module's own, which
the planner cannot rebuild): the strategies' compiled peaks less what the narrower moments save
(`fitjax.planner._moments`), so its peak is an estimate, and the message says so. On XLA:TPU it
bounds the compiled peak from above (the narrow moments' update is fused and holds less than
float32's: tests/planner/test_out_of_memory.py); XLA:CPU does not fuse it, and its float32
temporaries can outweigh the saving (measured: a 0.8 MiB model's peak 2.6 MiB with float32
moments, 3.9 MiB with bfloat16), so the change is not offered for a CPU.
When nothing fits, the error says the smallest peak found and how many devices FSDP would need
to hold the state.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Sequence

import jax

from fitjax import step as step_lib
from fitjax.planner import _sweep
from fitjax.planner._measure import Measured
from fitjax.planner._moments import STORAGES
from fitjax.planner._plan import plan_with_candidates
from fitjax.planner._report import Plan, human_bytes
from fitjax.planner._targets import Target
from fitjax.strategies import Strategy

__all__ = ["OutOfMemoryError", "cheapest_fit", "is_out_of_memory", "out_of_memory_error", "xla_figures"]

_SIZE = r"(\d+(?:\.\d+)?)\s*([KMGTP]i?B?|B)?"
# XLA's sentences, each with (what is needed, what there is); either may be missing
_FIGURES = (
    re.compile(rf"required for .*?\({_SIZE}\) exceeds available \w+ \({_SIZE}\)"),  # XLA:TPU, compiling
    re.compile(rf"Used {_SIZE} of {_SIZE} \w+"),  # XLA:TPU, compiling
    re.compile(rf"Attempting to reserve {_SIZE} at .*?There are {_SIZE} free", re.S),  # TPU runtime
    re.compile(rf"(?:trying to )?allocate {_SIZE}(?: bytes)?.*?(?:memory limit|available)[^\d]*{_SIZE}", re.S),
    re.compile(rf"(?:trying to )?allocate {_SIZE}(?: bytes)?()()"),  # XLA:GPU, the BFC allocator
)
_MARKS = ("RESOURCE_EXHAUSTED", "Out of memory", "out of memory", "Ran out of memory", "Attempting to reserve")


class OutOfMemoryError(RuntimeError):
    """The train step does not fit the device's memory (or the budget): the message says what it
    needs, what there is, and the cheapest change the planner found that fits.

    Attributes:
        needed_bytes: what the step needs per device (XLA's figure, else the planner's peak;
            None: unsaid).
        available_bytes: what the device has, or the budget (None: unsaid).
        change: the change that fits, as Trainer arguments and a batch size (None: none found).
    """

    def __init__(self, message: str, *, needed_bytes: int | None, available_bytes: int | None,
                 change: str | None) -> None:
        super().__init__(message)
        self.needed_bytes, self.available_bytes, self.change = needed_bytes, available_bytes, change


def is_out_of_memory(error: BaseException) -> bool:
    """Whether `error` is XLA running out of device memory."""
    text = str(error)
    return isinstance(error, Exception) and any(mark in text for mark in _MARKS) and not isinstance(
        error, (OutOfMemoryError, MemoryError))


def _bytes(number: str, unit: str | None) -> int:
    unit = (unit or "B").upper().replace("I", "").rstrip("B") or "B"
    return int(float(number) * 1024 ** "BKMGTP".index(unit))


def xla_figures(text: str) -> tuple[int | None, int | None]:
    """`(needed, available)` bytes from XLA's out-of-memory message (None where it says none).

    Example:
        >>> xla_figures("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required "
        ...             "for HLO temporaries (23.84G) exceeds available HBM (15.75G).")
        (25598005084, 16911433728)
    """
    for pattern in _FIGURES:
        found = pattern.search(text)
        if found:
            n1, u1, n2, u2 = found.groups()
            return _bytes(n1, u1), (_bytes(n2, u2) if n2 else None)
    return None, None


@dataclasses.dataclass(frozen=True)
class _Tried:
    """One kind of change: its sweep and how it reads as Trainer arguments."""

    sweep: dict[str, list]
    label: str


def cheapest_fit(module: Any, batch: Any, target: Target, *, strategy: Strategy, options: step_lib.StepOptions,
                 headroom: float, tried_strategies: bool = False) -> tuple[Measured | None, Plan | None]:
    """The first candidate that fits `target.memory_bytes` (less `headroom`), trying the kinds of
    change of the module docstring in order; `(None, the last plan)` when none does.
    `tried_strategies`: the strategies (and remat) were planned already (`strategy="plan"`)."""
    devices = target.devices
    names = list(_sweep.strategy_variants(strategy, devices)) if len(devices) > 1 else ["as configured"]
    rows = jax.tree.leaves(batch)[0].shape[0]
    k0 = options.accumulate_grad_batches
    ks = [k0 * f for f in (2, 4, 8) if rows % f == 0 and (rows // f) % len(devices) == 0]
    stages: list[dict[str, list]] = []
    if not tried_strategies:
        stages.append({"strategy": names})
    stages += [{"strategy": names, "accumulate": [k]} for k in ks]  # smallest change first
    if options.remat == "none":
        stages += [{"strategy": names, "remat": ["full"]}] if not tried_strategies else []
        stages += [{"strategy": names, "remat": ["full"], "accumulate": [k]} for k in ks]
    moments_at = 1 + len(ks) if not tried_strategies else len(ks)  # after the micro-batches, before remat
    stages.insert(moments_at, {"strategy": names, "moments": True})
    last = strategies = None
    for sweep in stages:
        if sweep.pop("moments", False):  # priced from the strategies' compiled peaks
            if strategies is None:
                strategies, _ = plan_with_candidates(module, batch, target, strategy=strategy, options=options,
                                                     sweep=sweep, headroom=headroom)
            found = _narrower_moments(strategies) if target.platform != "cpu" else None
            if found is not None:
                return found, strategies
            continue
        plan, _ = plan_with_candidates(module, batch, target, strategy=strategy, options=options, sweep=sweep,
                                       headroom=headroom)
        last = plan
        if set(sweep) == {"strategy"}:
            strategies = plan
        if plan.recommended is not None and plan.recommended.fits is not False:
            return plan.recommended, plan
    return None, last


def _narrower_moments(plan: Plan) -> Measured | None:
    """The first strategy of `plan` that fits with Adam's moments in bfloat16, else in int8 (the
    compiled peak less what the narrower moments save; an estimate), where they are wider now."""
    for storage in STORAGES:
        for m in plan.candidates:
            moments = m.moments
            if moments is None or m.memory["peak"] is None or moments["storage"] not in STORAGES or \
                    STORAGES.index(moments["storage"]) >= STORAGES.index(storage):
                continue
            saved = moments["bytes"] - moments[storage]
            memory = {**m.memory, "peak": m.memory["peak"] - saved, "optimizer": m.memory["optimizer"] - saved}
            narrower = dataclasses.replace(m, memory=memory, out_of_memory=None, estimated_moments=storage,
                                           moments={**moments, "storage": storage, "bytes": moments[storage]})
            if narrower.fits is not False:
                return narrower
    return None


def _same_strategy(found: Measured, strategy: Strategy) -> bool:
    try:
        return dict(strategy.mesh.shape) == found.mesh and bool(getattr(strategy, "zero1", False)) == found.zero1
    except Exception:  # noqa: BLE001 - a strategy not set up over devices (strategy="plan"'s base): another
        return False


def _change(found: Measured, options: step_lib.StepOptions, rows: int, strategy: Strategy) -> str:
    """`found`'s difference from the trainer's configuration, as what to pass."""
    parts = []
    name = "as configured" if found.name.startswith("as configured") else found.name.split(" ")[0]
    if name != "as configured" and not _same_strategy(found, strategy):
        extra = [part for part in re.findall(r"(data=\d+|tensor=\d+)", name)]  # "fsdp(data=2,fsdp=4)"
        parts.append(f"strategy=FSDP({', '.join(extra)})" if extra else f"strategy={name!r}")
    if found.remat != options.remat:
        parts.append(f"remat={found.remat!r}")
    change = f"Trainer({', '.join(parts)})" if parts else ""
    if found.estimated_moments is not None:
        moments = (f"`configure_optimizer` returning `fj.optim.adamw(..., moments={found.estimated_moments!r})` "
                   f"(Adam's moments stored in {found.estimated_moments} between steps)")
        change = f"{change} with {moments}" if change else moments
    if found.accumulate != options.accumulate_grad_batches:
        k = found.accumulate
        parts.append(f"accumulate_grad_batches={k}")
        change = (f"Trainer({', '.join(parts)}) with batches of {found.micro_batch} rows, not "
                  f"{rows} (the same {rows * options.accumulate_grad_batches} rows per optimizer step)")
    return change


def out_of_memory_error(module: Any, batch: Any, target: Target, *, strategy: Strategy,
                        options: step_lib.StepOptions, headroom: float, xla_text: str | None = None,
                        smallest: Measured | None = None, tried_strategies: bool = False) -> OutOfMemoryError:
    """The error to raise (see the module): from XLA's message `xla_text`, or from a budget that
    the plan's `smallest` candidate exceeds. `target.memory_bytes`: the device's memory or the
    budget (XLA's figure of what there is, where the device states none)."""
    needed, available = xla_figures(xla_text or "")
    if smallest is not None:
        needed = needed or smallest.memory["peak"]
    available = target.memory_bytes or available
    if available is not None and target.memory_bytes is None:
        target = target._replace(memory_bytes=available)
    batch = jax.tree.map(lambda x: jax.ShapeDtypeStruct(tuple(x.shape), x.dtype), batch)
    rows = jax.tree.leaves(batch)[0].shape[0]
    where = f"{len(target.devices)} × {target.devices[0].device_kind}"
    budget = "" if not available or not headroom else \
        f" (less {headroom:.0%} headroom: {human_bytes(available * (1 - headroom))})"
    lines = [f"The train step does not fit in memory: it needs {human_bytes(needed)} per device and "
             f"{where} {'has' if smallest is None else 'is given'} {human_bytes(available)}{budget}"
             + (f"; XLA said: {xla_text.strip().splitlines()[0]}" if xla_text else ".")]
    change = None
    if available is None:
        lines.append("The device states no memory size, so the planner cannot say what fits; "
                     "`trainer.plan(module, data, sweep=True, memory_bytes=...)` compares the options.")
    else:
        try:
            found, plan = cheapest_fit(module, batch, target, strategy=strategy, options=options, headroom=headroom,
                                       tried_strategies=tried_strategies)
        except Exception as error:  # noqa: BLE001 - the explanation must not hide the error it explains
            found, plan = None, None
            lines.append(f"The planner could not compile the alternatives ({type(error).__name__}: {error}).")
        if found is not None and not _change(found, options, rows, strategy):
            lines.append(f"The step as configured fits by XLA's memory analysis ({human_bytes(found.memory['peak'])} "
                         f"per device at its peak): the rest of the memory is held by other arrays (ones you keep, "
                         f"another process on the device) or fragmented.")
        elif found is not None:
            change = _change(found, options, rows, strategy)
            how = (f"the planner compiled it: XLA's memory analysis, {found.name}" if found.estimated_moments is None
                   else f"estimated: {found.name}'s compiled peak less what the narrower moments save")
            lines.append(f"The cheapest change that fits: {change}: its peak is {human_bytes(found.memory['peak'])} "
                         f"per device ({how}).")
        elif plan is not None and plan.candidates:
            best = min(plan.candidates, key=lambda m: m.memory["peak"] or math.inf)
            state = (best.memory["params"] or 0) + (best.memory["optimizer"] or 0)
            rest = (best.memory["peak"] or 0) - state
            room = available * (1 - headroom) - rest
            more = (f"; parameters and optimizer state are {human_bytes(state)} of it, which FSDP shards: about "
                    f"{math.ceil(state * len(target.devices) / room)} devices would hold them" if room > 0 else "")
            lines.append(f"No strategy, micro-batch size or remat fits on these devices: the smallest peak is "
                         f"{best.name}'s, {human_bytes(best.memory['peak'])}{more}. Use more devices, a smaller "
                         f"model or batch{_narrower_precision(options.precision.name)}.")
    lines.append("`trainer.plan(module, data, sweep=True)` shows every candidate (docs/guides/plan.md).")
    return OutOfMemoryError("\n".join(lines), needed_bytes=needed, available_bytes=available, change=change)


def _narrower_precision(name: str) -> str:
    """The precision to offer last, by what the step uses: 16-bit where it is 32- or 64-bit, 16-bit
    weights where only the computation is; nothing where the weights already are."""
    if name in ("32-true", "64-true"):
        return ", or bf16 (`precision=\"bf16-mixed\"`; `\"bf16-true\"` also stores the weights in bfloat16)"
    if name in ("bf16-mixed", "16-mixed"):
        return ", or bfloat16 weights and gradients (`precision=\"bf16-true\"`)"
    return ""


def smallest(candidates: Sequence[Measured]) -> Measured | None:
    """The candidate with the smallest peak."""
    return min(candidates, key=lambda m: m.memory["peak"] or math.inf, default=None)
