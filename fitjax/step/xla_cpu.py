"""How fitjax compiles for XLA:CPU: per-program options and a per-step plan. (The one process-wide
flag, XLA:CPU's scheduler, is set by `fitjax._bootstrap` at `import fitjax`.)

**The scratch plan (per train step).** XLA:CPU mallocs each call's scratch ("temp") buffers
afresh, on a worker thread. glibc serves a
request over 32 MiB (`_MMAP_LIMIT`, its largest mmap threshold) from that thread's arena only
with new pages (mmap), and gives them back on free, so every page is faulted in again on every
step. The small CNN of `benchmarks/overhead.py` has 135 MiB of scratch: ~33,000 faults and ~95 ms
of kernel time in each ~170 ms step, in a hand-written loop as much as here.

So on CPU, at the step's first call, the program compiled for it is measured
(`memory_analysis()`, then the buffer shapes of its HLO when the scratch is over `_MMAP_LIMIT`):

1. When no single buffer is over `_HEAP_MAX`, the step is compiled again with its scratch split
   into heaps of at most `max(_HEAP, largest buffer)` bytes (XLA's
   `xla_multiheap_size_constraint_per_heap`). Each heap is under glibc's threshold, so malloc
   hands the same pages back step after step: the small CNN's step runs ~1.3x faster, on the
   same numbers (only where buffers live changes). The state stays donated.
2. Otherwise, the state is not donated when the state is small next to the scratch (at most a
   quarter: not donating adds a state's worth of memory) and every state leaf is under
   `_MMAP_LIMIT`. A donated program keeps more values in scratch, and those bytes are faulted
   too (5-10% a step for the CNN before 1. existed).

The step is compiled first with heaps of `_HEAP` (the first case's usual answer; a scratch
smaller than a heap compiles to the same program: the tiny MLP's HLO is identical), so a step
whose plan is that compiles once: the small CNN's fit started ~0.7 s sooner (one compilation of
0.9 s where there were two, 0.9 s and 0.8 s). Another plan compiles the step a second time.
Everywhere else, and on every other platform, the step is the donated one, compiled once.

**LLVM at level 2 (every program fitjax compiles).** XLA:CPU turns each fused kernel into
LLVM IR and optimises it at `xla_backend_optimization_level` (XLA's default 3: LLVM's `-O3`).
For the programs a fit compiles, level 2 takes ~30% less compile time and gives the same steps:
the Flax MNIST port's train step compiled in 0.78-0.85 s against 1.16-1.24 s, its steps ran
6.26-6.35 ms against 6.21-6.51 ms, and the fit's validation loss was the same bits
(`python benchmarks/compile_level.py` measures the workloads of `benchmarks/`, both levels side
by side). The heavy operations (convolutions, matrix products) are library calls, not generated
code, so `-O3`'s extra passes find little to do. `compiler_options` adds the level to a CPU
program's options; a user's `XLA_FLAGS` setting of it is not overridden (per-program options
win over flags, so it is read and kept).

**Convolutions of several runs (`Trainer(runs=N)`).** The runs' step is `vmap`ped over a
leading runs axis. Where a convolution's input and kernel both have that axis (every layer
after the first, and the backward convolutions), `vmap` makes one grouped convolution
(`feature_group_count=N`), which XLA:CPU runs on a slow generic path: the digits CNN's step of 8
runs ran at 0.3-0.5x the speed of 8 single-run steps. Alternatives measured (in one process,
`jax.grad` of a 3x3 convolution, 8 runs): the grouped convolution 140-210 ms, 8 convolutions in
a `lax.map`/`fori_loop` 650-830 ms (a convolution inside a loop body is slower still on XLA:CPU),
8 separate convolutions in the program 20-23 ms, as fast as 8 separate calls. So on CPU,
`runs_vmap` gives a `vmap` under which such a convolution is computed as one plain convolution
per run, stacked (`_conv_per_run`); the rest of the step stays vmapped (dense layers batch well),
and a convolution with only one batched operand (the first layer, every run on the same batch)
keeps `vmap`'s own rule, which folds the runs into the features. The digits CNN's step of 8 runs
then runs at 0.60-0.93x the speed of 8 single-run steps (0.24-0.53x grouped; 1.8-2.6x faster in
each of four processes on a shared 2-core CPU); the program holds one convolution per run where it
held one grouped one, and compiles ~1 s longer (2.2-2.5 s against 1.2-1.3 s). A GPU or TPU runs
grouped convolutions well: there `runs_vmap` is `jax.vmap`.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import re
import warnings
from typing import Any, Callable, Iterator, NamedTuple

import jax
import jax.numpy as jnp

__all__ = ["Plan", "PlannedStep", "compiler_options", "largest_buffer_bytes", "plan", "runs_vmap",
           "saves_compete_with_the_step", "step", "unrolls_loops"]

_OPT_LEVEL = "xla_backend_optimization_level"
_LEVEL = 2


def compiler_options(platform: str, options: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """`options` for a program compiled for `platform`, with LLVM's level 2 on CPU (module
    docstring) unless `options` or the user's `XLA_FLAGS` name a level."""
    if platform != "cpu" or _OPT_LEVEL in (options or {}) or _OPT_LEVEL in os.environ.get("XLA_FLAGS", ""):
        return options
    return {_OPT_LEVEL: _LEVEL, **(options or {})}


_MMAP_LIMIT = 32 << 20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit hosts
_HEAP = 16 << 20  # the heap size asked for when every buffer fits in it
_HEAP_MAX = 30 << 20  # the largest buffer a heap may be sized to (room under _MMAP_LIMIT)
_STATE_SHARE = 4  # without heaps, donation is kept when the state is more than 1/4 of the scratch
_HEAP_OPTION = "xla_multiheap_size_constraint_per_heap"


class Plan(NamedTuple):
    """How to compile a step: donate its state or not, and the scratch heap size (None: one)."""

    donate: bool = True
    heap_bytes: int | None = None

    @property
    def compiler_options(self) -> dict[str, Any] | None:
        return None if self.heap_bytes is None else {_HEAP_OPTION: self.heap_bytes}


def plan(*, platform: str, temp_bytes: int, largest_buffer_bytes: int, state_bytes: int,
         largest_leaf_bytes: int) -> Plan:
    """The plan for a step whose donated program has these sizes."""
    if platform != "cpu" or temp_bytes <= _MMAP_LIMIT:
        return Plan()
    if largest_buffer_bytes <= _HEAP_MAX:
        return Plan(heap_bytes=max(_HEAP, largest_buffer_bytes))
    return Plan(donate=state_bytes * _STATE_SHARE > temp_bytes or largest_leaf_bytes >= _MMAP_LIMIT)


_SHAPE = re.compile(r"\b(pred|bf16|c64|c128|[suf]\d+\w*)\[([\d,]*)\]")


def largest_buffer_bytes(hlo_text: str) -> int:
    """The size of the largest array shape in an HLO module's text: an upper bound on its largest
    buffer (shapes inside fusions are counted too)."""
    largest = 0
    for dtype, dims in _SHAPE.findall(hlo_text):
        if dtype == "pred":
            bits = 8
        elif dtype in ("c64", "c128"):
            bits = int(dtype[1:])
        else:
            bits = int(re.match(r"[a-z]+(\d+)", dtype).group(1))
        elements = math.prod(int(d) for d in dims.split(",") if d)
        largest = max(largest, elements * max(bits, 8) // 8)
    return largest


def step(jit: Callable[..., Callable], *, platform: str) -> Callable:
    """`step(state, inputs)` from `jit(donate=True, compiler_options=None)`, which jits the step.
    Off CPU that is `jit()` itself; on CPU, a `PlannedStep` (the step `plan` picks at the first
    call)."""
    donated = jit()
    if platform != "cpu":
        return donated
    return PlannedStep(jit, donated)


class PlannedStep:
    """A CPU step compiled as `plan` says, decided from its first call's program."""

    __slots__ = ("_jit", "_donated", "_chosen")

    def __init__(self, jit: Callable[..., Callable], donated: Callable) -> None:
        self._jit, self._donated, self._chosen = jit, donated, None

    def __call__(self, state: Any, inputs: Any):
        if self._chosen is None:
            with _unstorable_heaps_quiet():
                self._chosen = self._choose(state, inputs)
                return self._chosen(state, inputs)  # its compilation, when another plan was chosen
        return self._chosen(state, inputs)

    def lower(self, state: Any, inputs: Any):
        """The lowered program the step runs for these arguments (`jax.jit(...).lower`)."""
        if self._chosen is None:
            with _unstorable_heaps_quiet():
                self._chosen = self._choose(state, inputs)
        return self._chosen.lower(state, inputs)

    def _choose(self, state: Any, inputs: Any) -> Callable:
        # Compiled first as most large-scratch steps end up (heaps of `_HEAP`), so that they
        # compile once; a scratch under `_HEAP` is one heap either way (the same program).
        first = self._jit(donate=True, compiler_options=_FIRST.compiler_options)
        compiled = first.lower(state, inputs).compile()  # reused by `first`'s own calls
        memory = compiled.memory_analysis()
        if memory is None or memory.temp_size_in_bytes <= _MMAP_LIMIT:
            return first
        leaves = [leaf.nbytes for leaf in jax.tree.leaves(state)]
        chosen_plan = plan(platform="cpu", temp_bytes=memory.temp_size_in_bytes,
                           largest_buffer_bytes=largest_buffer_bytes(compiled.as_text()),
                           state_bytes=sum(leaves), largest_leaf_bytes=max(leaves, default=0))
        if chosen_plan == _FIRST:
            return first
        if chosen_plan == Plan():
            return self._donated
        return self._jit(donate=chosen_plan.donate, compiler_options=chosen_plan.compiler_options)


_FIRST = Plan(heap_bytes=_HEAP)  # the program a CPU step is compiled as first


@contextlib.contextmanager
def _unstorable_heaps_quiet() -> Iterator[None]:
    """XLA:CPU cannot serialize a program whose scratch is several heaps ("Multiple temp buffer
    allocations found"), so JAX's persistent compile cache (`Trainer(compile_cache=...)`) does
    not store such a step and warns at each compilation; the step runs the same, compiled again
    by the next process. The trade, measured on the tiny GPT's step (scratch over 16 MiB): heaps
    71 ms a step against 78 ms in one heap, against ~15-20 s of compilation a warm start would
    skip; a step under 16 MiB of scratch is one heap and is stored."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Error writing persistent compilation cache entry.*"
                                                  r"Multiple temp buffer allocations")
        yield


# The name of the runs' vmapped axis on CPU: the convolution rule loops over this axis only (a
# user's own `vmap` inside the step keeps JAX's rule).
_RUNS_AXIS = "fitjax_runs"


def runs_vmap(*, platform: str, sharded: bool = False) -> Callable[..., Callable]:
    """The `jax.vmap` the runs of `Trainer(runs=N)` are computed with (module docstring): on
    CPU, with the runs' axis not `sharded` over devices, one under which a convolution whose
    input and kernel both hold the runs is one convolution per run; elsewhere `jax.vmap`."""
    if platform != "cpu" or sharded or not _conv_per_run_installed():
        return jax.vmap
    return functools.partial(jax.vmap, axis_name=_RUNS_AXIS)


@functools.cache
def _conv_per_run_installed() -> bool:
    """Puts `_conv_per_run` in front of JAX's batching rule for convolutions, once. JAX has no
    public way to change a primitive's batching rule: where its internals differ from those this
    was written for, nothing is installed and the runs keep `vmap`'s grouped convolutions."""
    try:
        from fitjax._jax_compat import batching_rules

        rules = batching_rules()
        conv = jax.lax.conv_general_dilated_p
        rules[conv] = functools.partial(_conv_per_run, rules[conv], conv)
    except (ImportError, AttributeError, KeyError):
        return False
    return True


def _conv_per_run(batched: Callable, conv: Any, axis_data: Any, args: tuple, dims: tuple, **params: Any):
    """JAX's batching rule for a convolution (`batched`), except over the runs' axis when input
    and kernel both hold it: one convolution per run, stacked on axis 0."""
    (lhs, rhs), (lhs_dim, rhs_dim) = args, dims
    if axis_data.name != _RUNS_AXIS or lhs_dim is None or rhs_dim is None:
        return batched(axis_data, args, dims, **params)
    one = functools.partial(jax.lax.index_in_dim, keepdims=False)
    return jnp.stack([conv.bind(one(lhs, i, lhs_dim), one(rhs, i, rhs_dim), **params)
                      for i in range(lhs.shape[lhs_dim])]), 0


def unrolls_loops(*, platform: str, step_fn: Callable, state: Any, inputs: Any, trips: int) -> bool:
    """Whether the train step's loops (over micro-batches with `accumulate_grad_batches`, over
    steps with `steps_per_execution`: `trips` micro-steps a call in all) are unrolled into one
    straight program: on CPU, when the step (`step_fn(state, inputs)`, traced abstractly) holds a
    convolution and `trips` is at most `_UNROLL_MAX`.

    XLA:CPU runs a convolution's gradient inside a loop body on a slow path: measured, the
    kernel gradient of a 3x3 convolution (32 images of 8x8x32, 64 filters) took 115 ms four
    times in a `fori_loop` against 4.2 ms unrolled, and the digits CNN's epoch took 9.5x as long
    with `accumulate_grad_batches=2` and 8.3x with `steps_per_execution=4`. Unrolled, the
    program computes the same, compiled in a time that grows with the loops' length: the digits
    CNN's 3-epoch fit with `steps_per_execution=32` took 19.7 s unrolled (2.7 s with 1), so
    longer loops are kept. Other platforms keep their loops."""
    if platform != "cpu" or trips > _UNROLL_MAX:
        return False
    return _holds_convolution(jax.make_jaxpr(step_fn)(state, inputs).jaxpr)


_UNROLL_MAX = 8  # micro-steps a call unrolled at most (the compile grows with them)


def saves_compete_with_the_step(platform: str) -> bool:
    """Whether a checkpoint written on a thread beside the loop slows the train step, so that
    the default checkpoint waits for each write and counts it as the save's cost: on CPU, where
    the host's cores run the step (on 2 cores a save in the background cost the tiny MLP's loop
    ~75 ms, more than the save itself). On an accelerator the host's cores only feed it: a TPU
    v5e host wrote GPT-2 small's 1.42 GiB state in ~3.2 s after a ~0.2 s copy to host memory,
    and waiting for the writes made a defaults-on fit with 8-step epochs 0.33x the plain fit
    (`benchmarks/gpt.py`, `benchmarks/results/tpu-v5e/gpt-bf9c4ab.json`): there the loop goes on
    while it writes."""
    return platform == "cpu"


def saves_copy_on_device(platform: str) -> bool:
    """Whether a save first copies the state within the device's memory and brings the copy to
    the host beside the loop, rather than waiting for the state's transfer to the host: not on
    CPU, where the device's memory is the host's (a host copy is that copy). On a TPU v5e chip the
    transfer of GPT-2 small's 1.42 GiB state held the chip idle 383 ms a save
    (`benchmarks/results/tpu-v5e/gpt-b5437c5-idle.json`); a copy within the chip's memory moves
    it at the memory's bandwidth. The writer makes the copy only where the devices have room for
    it (`fitjax.checkpoint._writer._room_for_copy`)."""
    return platform != "cpu"


def _holds_convolution(jaxpr: Any) -> bool:
    """Whether `jaxpr` or any jaxpr inside it (a scan's body, a `jax.checkpoint`, a `cond`'s
    branches) holds a convolution."""
    for eqn in jaxpr.eqns:
        if eqn.primitive is jax.lax.conv_general_dilated_p:
            return True
        for value in eqn.params.values():
            for inner in value if isinstance(value, (list, tuple)) else (value,):
                inner = getattr(inner, "jaxpr", inner)  # a ClosedJaxpr's Jaxpr
                if hasattr(inner, "eqns") and _holds_convolution(inner):
                    return True
    return False
