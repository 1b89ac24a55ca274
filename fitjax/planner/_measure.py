"""One candidate measured: the train step fit would run, compiled for the target, never run.

`measure` lowers `step.abstract_train`'s program (the state abstract, nothing allocated) for the
candidate's strategy and options on the target's devices, and reads XLA's memory analysis (what
one device holds at the step's peak), cost analysis (FLOPs and bytes accessed) and the compiled
HLO's collectives. The roofline then estimates a step's time on the target:
`max(FLOPs / peak, bytes accessed / memory bandwidth) + collective bytes / interconnect`, with no
overlap of communication and compute assumed (so an upper bound on the time, where the figures
hold), and MFU as model FLOPs over that time at peak.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import time
from typing import Any

import jax

from fitjax import step as step_lib
from fitjax.planner import _flops, _hlo
from fitjax.planner._moments import adam_moments
from fitjax.planner._targets import Target, quiet_stderr
from fitjax.step import jitted
from fitjax.strategies import HOST, Strategy, bytes_per_device

__all__ = ["Candidate", "Measured", "measure"]


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One way to run the step: a strategy over the target's devices and the step options."""

    name: str
    strategy: Strategy  # set up over the target's devices
    options: step_lib.StepOptions
    #: one step's batch: shapes and dtypes (`jax.ShapeDtypeStruct`s), the global batch
    batch: Any


@dataclasses.dataclass(frozen=True)
class Measured:
    """What the compiled step of one candidate costs each device (all byte counts per device)."""

    name: str
    mesh: dict[str, int]
    precision: str
    remat: str
    zero1: bool
    micro_batch: int
    accumulate: int
    #: params, optimizer, other_state, batch, temporaries (gradients and activations), peak;
    #: host: the part of the state kept in host memory (`Trainer(offload=...)`), not in the peak
    memory: dict[str, int]
    memory_limit: int | None
    headroom: float
    #: model FLOPs of one optimizer step on one device, and where the count comes from:
    #: "6N+attention", "flops_per_batch", "xla" or "xla, no remat" (the same step compiled
    #: with `remat="none"`: rematerialized work is the hardware's, not the model's)
    model_flops: float | None
    model_flops_source: str
    #: XLA's FLOPs of one optimizer step on one device (rematerialized work included)
    xla_flops: float | None
    bytes_accessed: float | None
    collectives: dict[str, _hlo.Collective]
    #: the estimated step: compute at the device kind's measured share of its peak (the roofline's
    #: lower bound where the kind has no measurement), memory traffic, collectives
    step_time_s: float | None
    mfu: float | None
    compile_s: float
    #: the compiler's own refusal when the program cannot fit the device (XLA:TPU checks the
    #: memory as it compiles); then `memory["peak"]` is what it said it needs (None: unsaid)
    out_of_memory: str | None = None
    #: Adam's moments per device as stored now and in each storage `fj.optim.adamw(moments=...)`
    #: offers (`fitjax.planner._moments.adam_moments`); None: the optimizer holds no Adam
    moments: dict[str, Any] | None = None
    #: the moments' storage these figures were estimated for, from a compiled candidate whose
    #: moments are wider (the out-of-memory search's change); None: compiled as it is
    estimated_moments: str | None = None
    #: what the state keeps in host memory between steps (`Trainer(offload=...)`)
    offload: str = "none"

    @property
    def fits(self) -> bool | None:
        """Whether the peak fits the device's memory with `headroom` of it kept free (None: the
        device states no memory)."""
        if self.out_of_memory is not None:
            return False
        if self.memory_limit is None:
            return None
        return self.memory["peak"] <= self.memory_limit * (1.0 - self.headroom)

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["fits"] = self.fits
        out["collectives"] = {k: c._asdict() for k, c in self.collectives.items()}
        return out


_OUT_OF_MEMORY = "RESOURCE_EXHAUSTED"
_NEEDED = re.compile(r"\((\d+(?:\.\d+)?)([KMGT])\)")


def _refused(candidate: Candidate, target: Target, program, error: str, headroom: float, compile_s: float
             ) -> Measured:
    """A candidate the compiler refused for memory: what the state takes, what it said it needs."""
    options = candidate.options
    memory = _memory(program, None, candidate.strategy)
    said = _NEEDED.search(error)
    if said:
        memory["peak"] = int(float(said.group(1)) * 1024 ** " KMGT".index(said.group(2)))
    return Measured(
        name=candidate.name, mesh=dict(candidate.strategy.mesh.shape), precision=options.precision.name,
        remat=_options_remat(options), zero1=bool(getattr(candidate.strategy, "zero1", False)),
        micro_batch=jax.tree.leaves(candidate.batch)[0].shape[0], accumulate=options.accumulate_grad_batches,
        memory=memory, memory_limit=target.memory_bytes, headroom=headroom, model_flops=None,
        model_flops_source="-", xla_flops=None, bytes_accessed=None, collectives={}, step_time_s=None, mfu=None,
        compile_s=compile_s, out_of_memory=error.splitlines()[0], moments=adam_moments(program.state.opt_state),
        offload=options.offload)


def _options_remat(options: step_lib.StepOptions) -> str:
    return getattr(options, "remat", "none")


def measure(candidate: Candidate, target: Target, module: Any, *, headroom: float,
            plain_flops: float | None = None) -> Measured:
    """Compiles `candidate`'s train step for `target` and reads what it costs (see the module).
    `plain_flops`: XLA's FLOPs of the same step with `remat="none"` when already measured (a
    rematerialized candidate's model FLOPs; else it compiles that step too)."""
    spec = module.step_spec()
    strategy, options = candidate.strategy, candidate.options
    started = time.perf_counter()
    k, spe = options.accumulate_grad_batches, options.steps_per_execution
    with quiet_stderr() as said, options.precision.context(), _cache_for(target):
        program = jitted.abstract_train(spec, strategy, candidate.batch, options=options)
        try:
            compiled = program.train_step.lower(program.state, program.inputs).compile()
        except Exception as exc:
            if _OUT_OF_MEMORY in str(exc):
                return _refused(candidate, target, program, str(exc), headroom, time.perf_counter() - started)
            if target.platform == "tpu" and said().strip():
                exc.add_note(f"libtpu said:\n{said()}")
            raise
    compile_s = time.perf_counter() - started
    memory = _memory(program, compiled.memory_analysis(), strategy)
    text = compiled.as_text()
    # loops (micro-batches, steps, scanned layers) counted per iteration, from the program itself:
    # no second, unrolled compilation
    cost = jitted.cost_of(compiled, text)
    xla_flops = cost.get("flops")
    xla_flops = xla_flops / spe if xla_flops and xla_flops > 0 else None
    accessed = cost.get("bytes accessed")
    accessed = accessed / spe if accessed and accessed > 0 else None
    found = _hlo.collectives(text, len(target.devices))
    found = {kind: c._replace(count=c.count // spe, bytes=c.bytes // spe, wire_bytes=c.wire_bytes / spe)
             for kind, c in found.items()}
    rows = jax.tree.leaves(candidate.batch)[0].shape[0]
    counted_model = _flops.model_flops(module, program.state.params, rows_per_step=rows * k,
                                       batches_per_step=k, devices=len(target.devices), batch=candidate.batch)
    if counted_model is not None:
        model, source = counted_model.per_step / len(target.devices), counted_model.source
    elif options.remat != "none":  # XLA's count of the step without remat: the model's work, not the hardware's
        with _cache_for(target):
            model = plain_flops or _unrematerialized_flops(spec, strategy, candidate.batch, options)
        source = "xla, no remat"
    else:
        model, source = xla_flops, "xla"
    step_s, mfu = _roofline(target, xla_flops, accessed, found, model)
    return Measured(
        name=candidate.name, mesh=dict(strategy.mesh.shape), precision=options.precision.name,
        remat=_options_remat(options), zero1=bool(getattr(strategy, "zero1", False)), micro_batch=rows,
        accumulate=k, memory=memory, memory_limit=target.memory_bytes, headroom=headroom, model_flops=model,
        model_flops_source=source, xla_flops=xla_flops, bytes_accessed=accessed, collectives=found,
        step_time_s=step_s, mfu=mfu, compile_s=compile_s, moments=adam_moments(program.state.opt_state),
        offload=options.offload)


@contextlib.contextmanager
def _cache_for(target: Target):
    """JAX's persistent compile cache off while compiling for a topology: a program compiled for
    devices this process has no client for cannot be read back from it (JAX warns "PjRtCompiler
    must be constructed with a Client" at every later plan), and nothing runs it here."""
    if not target.deviceless or not jax.config.jax_enable_compilation_cache:
        yield
        return
    jax.config.update("jax_enable_compilation_cache", False)
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", True)


def _unrematerialized_flops(spec, strategy: Strategy, batch: Any, options: step_lib.StepOptions) -> float | None:
    """XLA's FLOPs of one optimizer step on one device with `remat="none"` (one more compilation)."""
    plain = dataclasses.replace(options, remat="none")
    with quiet_stderr(), plain.precision.context():
        program = jitted.abstract_train(spec, strategy, batch, options=plain)
        flops = jitted.cost_of(program.train_step.lower(program.state, program.inputs).compile()).get("flops")
    return flops / options.steps_per_execution if flops and flops > 0 else None


def _memory(program: jitted.AbstractTrain, analysis: Any, strategy: Strategy) -> dict[str, int]:
    state = program.state
    other = (state.step, state.model_state, state.rng, state.metrics, state.loss_scale, state.extras)
    batch = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(program.inputs))
    host = bytes_per_device([x for x in jax.tree.leaves(state) if getattr(x.sharding, "memory_kind", None) == HOST])
    peak = None if analysis is None else jitted.step_memory_bytes(analysis)
    if peak is not None and host and not getattr(analysis, "host_argument_size_in_bytes", 0):
        peak -= host  # XLA:CPU counts its host memory kind as the device's (one RAM); XLA:TPU apart
    return {
        "params": bytes_per_device(state.params),
        "optimizer": bytes_per_device(state.opt_state),
        "other_state": bytes_per_device(other),
        "batch": batch // strategy.num_batch_shards,
        "temporaries": None if analysis is None else int(analysis.temp_size_in_bytes),
        "host": host,
        # XLA's own peak in device memory: arguments + outputs (a donated argument counted once) + scratch
        "peak": peak,
    }


def _roofline(target: Target, flops: float | None, accessed: float | None, found: dict,
              model: float | None) -> tuple[float | None, float | None]:
    spec = target.spec
    if spec is None or flops is None:
        return None, None
    # XLA counts no FLOPs inside custom calls (a Pallas attention kernel), and the model's count
    # has no rematerialized work: the larger of the two is the work the device does
    compute = max(flops, model or 0.0) / (spec.peak_flops * (spec.efficiency or 1.0))
    memory = (accessed or 0.0) / spec.memory_bandwidth
    comm = sum(c.wire_bytes for c in found.values()) / spec.interconnect_bandwidth
    step_s = max(compute, memory) + comm
    mfu = model / (step_s * spec.peak_flops) if model and step_s > 0 else None
    return step_s, mfu
