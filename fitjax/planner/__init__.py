"""The planner: will a training step fit, and how fast will it run, on a target, before training.

It compiles the very train step `fit` would run (`fitjax.step.jitted.abstract_train`: the same
state, options and shardings, the state abstract so nothing is allocated) for a target's devices
(this machine's, or a TPU slice compiled deviceless with libtpu) and reads XLA's own memory and
cost analyses and the compiled program's collectives (`measure`). `Trainer.plan` / `fj.plan` and
`fitjax plan` drive it.
"""

from fitjax.planner._choose import Choice, PlannedStrategy, choose, planned_strategy
from fitjax.planner._devices import KINDS, DeviceSpec, spec_for
from fitjax.planner._flops import ModelFlops, TransformerShape, model_flops
from fitjax.planner._hlo import Collective, collectives
from fitjax.planner._measure import Candidate, Measured, measure
from fitjax.planner._out_of_memory import OutOfMemoryError, is_out_of_memory, out_of_memory_error, xla_figures
from fitjax.planner._plan import plan
from fitjax.planner._report import Plan, human_bytes
from fitjax.planner._sweep import AXES, candidates, recommend
from fitjax.planner._targets import Target, device_memory_limit, quiet_stderr, resolve_target

__all__ = ["Candidate", "Choice", "Collective", "DeviceSpec", "Measured", "ModelFlops", "OutOfMemoryError", "Plan",
           "PlannedStrategy", "Target", "TransformerShape", "candidates", "choose", "collectives",
           "device_memory_limit", "human_bytes", "is_out_of_memory", "measure", "model_flops", "out_of_memory_error",
           "plan", "planned_strategy", "quiet_stderr", "recommend", "resolve_target", "spec_for", "xla_figures"]
