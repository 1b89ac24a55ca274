"""The step layer: what runs under `jax.jit` (DESIGN.md, layer 2).

One gradient function and the options around it (`train`), the one call of the user's code on
the bound model that every step makes (`forward`), what a module gives the step layer
(`module_spec.ModuleSpec`, the only way it reads the module), which parameters train
(`trainable`), the optimizer update inside the backward pass for a model whose scanned layer
stack is offered through `layer_stack` (`in_backward`), the Linen/NNX binding
(`model_binding`), the options that shape the step (`options`), the state pieces callbacks add
around it (`pieces`), host batches grouped into step calls (`grouping`), and the build that jits
every variant once per shape with the strategy's shardings (`jitted.build`, compiled as `xla_cpu`
plans on XLA:CPU), and the one way every fitjax program is jitted (`compiling.jit`). It imports
nothing from data, checkpointing, the loop, callbacks or loggers.
"""

from fitjax.step.jitted import Compiled, build, check_optimizer
from fitjax.step.grouping import StepInputs, group_batches
from fitjax.step.module_spec import ModuleSpec
from fitjax.step.options import StepOptions, host_values
from fitjax.step.token_loss import TokenLoss

# For the Lightning adapter (fitjax.module): its traced hooks break the same jit rules as `loss`.
from fitjax.step._jit_rules import defined_at, explain_jit_rules

__all__ = ["Compiled", "ModuleSpec", "StepInputs", "StepOptions", "TokenLoss", "build", "check_optimizer", "group_batches", "host_values"]
