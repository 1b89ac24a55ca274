"""`plan`: every candidate compiled for the target and measured, then one recommended."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import jax
import numpy as np

from fitjax import step as step_lib
from fitjax.planner import _sweep
from fitjax.planner._measure import Candidate, measure
from fitjax.planner._report import Plan
from fitjax.planner._targets import Target
from fitjax.strategies import Strategy

__all__ = ["plan", "plan_with_candidates"]


def _check_headroom(headroom: Any) -> float:
    if isinstance(headroom, bool) or not isinstance(headroom, (int, float)) or not 0 <= headroom < 1:
        raise ValueError(f"plan(headroom=...) is the fraction of the device's memory kept free, in [0, 1), "
                         f"got {headroom!r}.")
    return float(headroom)


def plan(module: Any, batch: Any, target: Target, *, strategy: Strategy, options: step_lib.StepOptions,
         sweep: bool | Mapping[str, Sequence] = False, headroom: float = 0.1) -> Plan:
    """Measures each candidate's train step compiled for `target` (see `fitjax.planner`).

    `batch`: one train batch (arrays or `jax.ShapeDtypeStruct`s; shapes only) as `fit` would take
    it: the global batch of one micro-batch. `strategy` and `options`: the trainer's (the
    strategy is copied and set up over the target's devices). A candidate that does not compile
    is reported with its error, not raised, unless every one fails.
    """
    return plan_with_candidates(module, batch, target, strategy=strategy, options=options, sweep=sweep,
                                headroom=headroom)[0]


def plan_with_candidates(module: Any, batch: Any, target: Target, *, strategy: Strategy,
                         options: step_lib.StepOptions, sweep: bool | Mapping[str, Sequence] = False,
                         headroom: float = 0.1) -> tuple[Plan, dict[str, Candidate]]:
    """`plan`, and each measured candidate by its name (its strategy set up over the target's
    devices, its options)."""
    headroom = _check_headroom(headroom)
    batch = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), batch)
    measured, failed, made = [], [], {}
    plain: dict[str, float | None] = {}  # a candidate without remat's label -> its XLA FLOPs
    rules = getattr(module, "logical_axis_rules", None)  # the tensor variant splits what they name
    for name, make in _sweep.candidates(strategy, options, batch, target.devices, sweep, rules):
        try:
            candidate = made[name] = make()
            remat = candidate.options.remat
            key = name.replace(f" remat={remat}", "")  # the same candidate without remat
            measured.append(measure(candidate, target, module, headroom=headroom, plain_flops=plain.get(key)))
            if remat == "none":
                plain[key] = measured[-1].xla_flops
        except Exception as exc:  # noqa: BLE001 - a candidate that cannot run is part of the answer
            if sweep is False:
                raise
            failed.append((name, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"))
    if not measured:
        raise RuntimeError("plan: no candidate compiled:\n" + "\n".join(f"  {n}: {e}" for n, e in failed))
    recommended, reason = _sweep.recommend(measured)
    return Plan.of(target, measured, failed, recommended, reason), made
