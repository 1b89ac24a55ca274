"""`Trainer(strategy="plan")`: fit with the strategy the planner recommends for the devices it runs on.

At the start of each fit the planner compiles the train step for every strategy (dp, ZeRO-1,
fsdp, hybrid fsdp; fsdp × tensor where a configured FSDP's rules name a tensor axis) on the trainer's devices (again with activation rematerialization when none
fits without it), and fit runs the recommended one: the fastest estimate that fits (on a device with no peak figures,
such as a CPU, the fewest FLOPs and collective bytes), said in one line. Only choices that
leave the numbers as they are: the batch, precision and accumulation stay the trainer's.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, NamedTuple

from fitjax import step as step_lib
from fitjax.planner import _sweep
from fitjax.planner._out_of_memory import out_of_memory_error, smallest
from fitjax.planner._plan import plan_with_candidates
from fitjax.planner._report import Plan, human_bytes
from fitjax.planner._targets import resolve_target
from fitjax.strategies import FSDP, DataParallel, Strategy

__all__ = ["Choice", "PlannedStrategy", "choose", "planned_strategy"]


@dataclasses.dataclass(frozen=True)
class PlannedStrategy:
    """`Trainer(strategy=PlannedStrategy(...))`: the strategy and remat the planner recommends
    for the trainer's devices, chosen at the start of each fit; `strategy="plan"` is
    `PlannedStrategy()`.

    Args:
        memory_bytes: memory per device to fit in (None: what the device reports; a CPU
            reports none, so every candidate fits there unless this is given).
        headroom: the fraction of that memory kept free.
        rules: logical-axis rules for the fsdp candidates (`FSDP(rules=...)`), for a model whose
            parameters carry logical names.

    Example:
        >>> import fitjax as fj
        >>> from fitjax.planner import PlannedStrategy
        >>> trainer = fj.Trainer(strategy=PlannedStrategy(memory_bytes=16 * 2**30), max_steps=10)
    """

    memory_bytes: int | None = None
    headroom: float = 0.1
    rules: Mapping[str, Any] | None = None

    def __post_init__(self):
        if self.memory_bytes is not None and (isinstance(self.memory_bytes, bool) or not isinstance(
                self.memory_bytes, int) or self.memory_bytes <= 0):
            raise ValueError(f"PlannedStrategy(memory_bytes=...) must be a positive int (bytes per device) or None, "
                             f"got {self.memory_bytes!r}.")
        if isinstance(self.headroom, bool) or not isinstance(self.headroom, (int, float)) or not 0 <= self.headroom < 1:
            raise ValueError(f"PlannedStrategy(headroom=...) is the fraction of the device's memory kept free, in "
                             f"[0, 1), got {self.headroom!r}.")


def planned_strategy(strategy: Any) -> PlannedStrategy | None:
    """The `PlannedStrategy` that `Trainer(strategy=...)` asks for ("plan" or one), else None."""
    if isinstance(strategy, PlannedStrategy):
        return strategy
    return PlannedStrategy() if isinstance(strategy, str) and strategy == "plan" else None


class Choice(NamedTuple):
    """What `choose` picked: the strategy (set up over the devices), the options to fit with,
    the whole plan and the line that says it."""

    strategy: Strategy
    options: step_lib.StepOptions
    plan: Plan
    line: str


def choose(spec: PlannedStrategy, module: Any, batch: Any, devices, options: step_lib.StepOptions) -> Choice:
    """Plans every strategy on `devices` for `module`'s step on `batch` (one train batch), then
    with `remat="full"` if none fits (and the trainer set no remat), and returns the
    recommended one; an error showing the plan when none fits."""
    target = resolve_target("local", devices, memory_bytes=spec.memory_bytes)
    base = FSDP(rules=spec.rules) if spec.rules is not None else DataParallel()
    names = list(_sweep.strategy_variants(base, devices, getattr(module, "logical_axis_rules", None)))
    plan, made = plan_with_candidates(module, batch, target, strategy=base, options=options,
                                      sweep={"strategy": names}, headroom=spec.headroom)
    if plan.recommended is None and options.remat == "none":  # remat costs FLOPs: only when nothing fits without
        plan, made = plan_with_candidates(module, batch, target, strategy=base, options=options,
                                          sweep={"strategy": names, "remat": ["full"]}, headroom=spec.headroom)
    best = plan.recommended
    if best is None:  # what it needs, what there is, and the cheapest change (micro-batches, ...) that fits
        raise out_of_memory_error(module, batch, target, strategy=base, options=options, headroom=spec.headroom,
                                  smallest=smallest(plan.candidates), tried_strategies=True)
    chosen = made[best.name]
    peak = human_bytes(best.memory["peak"])
    line = (f"strategy 'plan' chose {best.name} ({peak} per device at its peak) of "
            f"{len(plan.candidates)} candidates: {plan.reason}")
    return Choice(chosen.strategy, dataclasses.replace(options, remat=chosen.options.remat), plan, line)
