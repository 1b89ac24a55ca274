"""`plan`: every candidate compiled for the target and measured, then one recommended."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import jax
import numpy as np

from fitjax import step as step_lib
from fitjax.planner import _sweep
from fitjax.planner._measure import measure
from fitjax.planner._report import Plan
from fitjax.planner._targets import Target
from fitjax.strategies import Strategy

__all__ = ["plan"]


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
    headroom = _check_headroom(headroom)
    batch = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), batch)
    measured, failed = [], []
    for name, make in _sweep.candidates(strategy, options, batch, target.devices, sweep):
        try:
            measured.append(measure(make(), target, module, headroom=headroom))
        except Exception as exc:  # noqa: BLE001 - a candidate that cannot run is part of the answer
            if sweep is False:
                raise
            failed.append((name, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"))
    if not measured:
        raise RuntimeError("plan: no candidate compiled:\n" + "\n".join(f"  {n}: {e}" for n, e in failed))
    recommended, reason = _sweep.recommend(measured)
    return Plan.of(target, measured, failed, recommended, reason)
