"""The candidates a plan compares, and the one it recommends.

Without a sweep the plan has one candidate: the trainer as configured, exactly what `fit` would
run. A sweep varies what the user leaves open, each axis a list: the strategy and its mesh
(`single` on one device, `dp`, `zero1` (dp with the optimizer state sharded), `fsdp`, hybrid
`fsdp` with 2 data replicas, and `fsdp` × 2-way tensor parallelism where the configured FSDP's
rules or the module's `logical_axis_rules` map some logical axis to "tensor", as
`fitjax.models.LOGICAL_RULES` does heads and MLP units), activation
rematerialization, micro-batches with gradient accumulation (the same global batch in `k`
micro-batches of `1/k` of it: same numbers, less activation memory), precision, and where the
optimizer state (and master weights) live between steps (`offload`: only when named, the plan
with `sweep=True` keeps the trainer's).
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
from typing import Any, Callable, Mapping, Sequence

import jax

from fitjax import precision as precision_lib
from fitjax.step.offload import check_offload
from fitjax import step as step_lib
from fitjax.planner._measure import Candidate, Measured
from fitjax.planner._report import human_bytes
from fitjax.strategies import FSDP, DataParallel, SingleDevice, Strategy

__all__ = ["AXES", "candidates", "recommend", "strategy_variants"]

#: what `sweep=True` varies; `sweep={axis: [values]}` picks its own
AXES = ("strategy", "accumulate", "precision", "remat", "offload")


def strategy_variants(base: Strategy, devices: Sequence, model_rules: Mapping[str, Any] | None = None
                      ) -> dict[str, Callable[[], Strategy]]:
    """name -> a fresh strategy, FSDP variants keeping the configured FSDP's rules (a model whose
    parameters carry logical names needs them; `model_rules`, the module's own
    `logical_axis_rules`, are added when its step is built, and count for the tensor variant)."""
    fsdp_args = {}
    if isinstance(base, FSDP):
        fsdp_args = {"rules": base.rules, "min_size_to_shard": base.min_size_to_shard}
    n = len(devices)
    if n == 1:
        return {"single": SingleDevice}
    made: dict[str, Callable[[], Strategy]] = {"dp": DataParallel, "zero1": lambda: DataParallel(zero1=True),
                                               "fsdp": lambda: FSDP(**fsdp_args)}
    if n >= 4 and n % 2 == 0:
        made[f"fsdp(data=2,fsdp={n // 2})"] = lambda: FSDP(data=2, **fsdp_args)
        if _names_tensor({**(model_rules or {}), **(fsdp_args.get("rules") or {})}):  # the model says which dimensions a tensor axis splits
            made[f"fsdp(fsdp={n // 2},tensor=2)"] = lambda: FSDP(tensor=2, **fsdp_args)
    return made


def _names_tensor(rules: Mapping[str, Any] | None) -> bool:
    """Whether FSDP rules map some logical axis to the `tensor` mesh axis."""
    def names(target: Any) -> bool:
        return target == "tensor" or isinstance(target, (tuple, list)) and "tensor" in target
    return any(names(target) for target in (rules or {}).values())


def _axis(sweep: Mapping[str, Sequence], name: str, default: Sequence) -> list:
    values = sweep.get(name, default)
    if isinstance(values, (str, int)) or not isinstance(values, Sequence):
        raise ValueError(f"plan(sweep={{{name!r}: ...}}) must be a list of values, got {values!r}.")
    return list(values)


def candidates(strategy: Strategy, options: step_lib.StepOptions, batch: Any, devices: Sequence,
               sweep: bool | Mapping[str, Sequence], model_rules: Mapping[str, Any] | None = None
               ) -> list[tuple[str, Callable[[], Candidate]]]:
    """`(name, make)` for each candidate (`make` builds it: a strategy is set up over `devices`
    only when its candidate is measured). `batch`: the global batch of one optimizer step."""
    def configured() -> Candidate:
        chosen = copy.copy(strategy)
        chosen.setup(devices)
        return Candidate("as configured", chosen, options, batch)

    if sweep is False or sweep is None:
        return [("as configured", configured)]
    if not isinstance(sweep, Mapping) and sweep is not True or isinstance(sweep, Mapping) and set(sweep) - set(AXES):
        raise ValueError(f"plan(sweep=...) takes True, False or {{axis: [values]}} with axes {list(AXES)}, "
                         f"got {sweep!r}.")
    variants = strategy_variants(strategy, devices, model_rules)
    if sweep is True:  # every axis
        sweep = {"strategy": list(variants)}
        every = True
    else:  # the axes named; the others as configured
        every = False
        variants["as configured"] = lambda: copy.copy(strategy)
    names = _axis(sweep, "strategy", ["as configured"])
    unknown = [s for s in names if s not in variants]
    if unknown:
        raise ValueError(f"plan(sweep={{'strategy': ...}}) got {unknown}; on {len(devices)} devices the "
                         f"strategies are {list(variants)}.")
    rows = jax.tree.leaves(batch)[0].shape[0]
    k0 = options.accumulate_grad_batches
    accumulate = _axis(sweep, "accumulate", [k0] + ([2 * k0] if every and rows % 2 == 0 else []))
    precisions = _axis(sweep, "precision", [options.precision.name])
    remat = getattr(options, "remat", "none")
    remats = _axis(sweep, "remat", list(dict.fromkeys(["none", remat, "full"])) if every and hasattr(options, "remat")
                   else [remat])
    offloads = [check_offload(o) for o in _axis(sweep, "offload", [getattr(options, "offload", "none")])]
    made = []
    for name, k, precision, remat, offload in itertools.product(names, accumulate, precisions, remats, offloads):
        total = rows * k0  # the global batch of one optimizer step stays the same
        if total % k:
            continue
        micro = total // k
        if micro % len(devices):  # no strategy here splits fewer rows than devices
            continue
        label = " ".join([name, *([precision] if len(precisions) > 1 else []),
                          *([f"remat={remat}"] if remat != "none" else []),
                          *([f"offload={offload}"] if len(offloads) > 1 and offload != "none" else []),
                          *([f"{k}×{micro}"] if k > 1 else [])])

        def make(name=name, k=k, precision=precision, remat=remat, micro=micro, label=label,
                 offload=offload) -> Candidate:
            chosen = variants[name]()
            chosen.setup(devices)
            replaced = {"accumulate_grad_batches": k, "precision": precision_lib.resolve(precision)}
            if hasattr(options, "remat"):
                replaced["remat"] = remat
            if hasattr(options, "offload"):
                replaced["offload"] = offload
            micro_batch = jax.tree.map(lambda x: jax.ShapeDtypeStruct((micro, *x.shape[1:]), x.dtype), batch)
            return Candidate(label, chosen, dataclasses.replace(options, **replaced), micro_batch)

        made.append((label, make))
    return made


def recommend(measured: Sequence[Measured]) -> tuple[Measured | None, str]:
    """The candidate to train with and why: the fastest estimated step among those that fit
    (all of them where the device states no memory); without a roofline (a device with no peak
    FLOPs in the table) the fewest XLA FLOPs, then the fewest collective bytes, then the
    smallest peak memory."""
    if not measured:
        return None, "no candidate compiled"
    fitting = [m for m in measured if m.fits is not False]
    if not fitting:
        best = min(measured, key=lambda m: m.memory["peak"] or float("inf"))
        return None, (f"none fits: the smallest peak is {best.name}'s, {human_bytes(best.memory['peak'])} per device, "
                      f"over {human_bytes(best.memory_limit * (1 - best.headroom))} ({human_bytes(best.memory_limit)} less "
                      f"{best.headroom:.0%} headroom); add devices, or try fsdp, remat or smaller micro-batches")
    timed = [m for m in fitting if m.step_time_s is not None]
    misses = [m.name for m in measured if m.fits is False]
    miss = f"; {', '.join(misses)} do{'es' if len(misses) == 1 else ''} not fit" if misses else ""
    room = (f" in {human_bytes(fitting[0].memory_limit * (1 - fitting[0].headroom))} per device"
            if fitting[0].memory_limit else "")
    if timed:
        best = min(timed, key=lambda m: m.step_time_s)
        mfu = f", MFU {best.mfu:.0%}" if best.mfu is not None else ""
        return best, (f"fastest estimated step ({best.step_time_s * 1e3:.3g} ms{mfu}) of the {len(fitting)} "
                      f"candidates that fit{room}{miss}")

    def cost(m: Measured):
        wire = sum(c.wire_bytes for c in m.collectives.values())
        return (round(m.xla_flops or 0.0, -3), wire, m.memory["peak"] or 0)

    best = min(fitting, key=cost)
    return best, (f"fewest FLOPs and collective bytes per device of the {len(fitting)} candidates that fit{room}"
                  f"{miss} (no peak FLOP/s known for this device kind: no time estimate)")
