"""Precision policies: which dtype the step computes in, which dtype the parameters live in.

`Trainer(precision=...)` takes Lightning's strings or a `Precision`:

- `"32-true"`: everything float32 (the default).
- `"bf16-mixed"`: float32 master parameters and optimizer state; at the start of each step the
  parameters and the floating inputs are cast to bfloat16, so the forward and backward passes run
  in bfloat16; gradients arrive in float32 (the cast's transpose) and the loss is kept float32.
- `"16-mixed"`: the same with float16, plus dynamic loss scaling: the loss is multiplied by a scale
  before differentiation and the gradients divided by it; a step whose gradients are not finite is
  skipped (parameters and optimizer state unchanged) and halves the scale, and `growth_interval`
  finite steps in a row double it. The scale lives in `TrainState.loss_scale`, so checkpoints
  carry it, and is logged as `loss_scale` together with `skipped_steps`.
- `"bf16-true"`: parameters, optimizer state and compute all bfloat16 (half the memory; plain SGD
  updates smaller than a bfloat16 ulp are lost — use it for inference-like fine-tuning).
- `"16-true"`: the same in float16 (Lightning's `model.half()`), without loss scaling: a loss
  whose gradients overflow float16 gives non-finite parameters (use "16-mixed" to train).
- `"64-true"`: parameters, optimizer state, inputs and compute all float64 (Lightning's
  `model.double()`). JAX computes in 64 bits only with `jax_enable_x64`, so the trainer turns it
  on while it runs (`fit`, `validate`, `test`, `predict`, inside `Precision.context()`) and back
  off after: the fit banner says "x64 enabled". The loss and metrics are logged as float32.

The outputs of a Linen model's top-level call are cast back to float32, so a softmax in `loss`
runs in float32; an NNX model's outputs keep the compute dtype — cast logits with
`logits.astype(jnp.float32)` in `loss` if you need that.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from fitjax._typing import PyTree

__all__ = ["LossScale", "Precision"]

_DTYPES = {
    "32-true": (jnp.float32, jnp.float32),
    "bf16-mixed": (jnp.bfloat16, jnp.float32),
    "16-mixed": (jnp.float16, jnp.float32),
    "bf16-true": (jnp.bfloat16, jnp.bfloat16),
    "16-true": (jnp.float16, jnp.float16),
    "64-true": (jnp.float64, jnp.float64),
}
_ALIASES = {"32": "32-true", 32: "32-true", "bf16": "bf16-mixed", "16": "16-mixed", 16: "16-mixed",
            "64": "64-true", 64: "64-true"}  # Lightning's short names


@flax.struct.dataclass
class LossScale:
    """Dynamic loss-scale state (a pytree in `TrainState.loss_scale`).

    Attributes:
        scale: the current multiplier of the loss (float32 scalar).
        good_steps: finite steps since the scale last changed.
        skipped: steps skipped for non-finite gradients since the run began.
    """

    scale: jax.Array
    good_steps: jax.Array
    skipped: jax.Array


@dataclasses.dataclass(frozen=True)
class Precision:
    """A precision policy; `Trainer(precision="bf16-mixed")` builds one from the name.

    Args:
        name: one of "32-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true", "64-true".
        init_scale: the first loss scale ("16-mixed" only; torch's GradScaler default).
        growth_interval: finite steps in a row after which the scale doubles.
        min_scale: the scale never halves below this.

    Example:
        >>> import fitjax as fj
        >>> policy = fj.Precision("16-mixed", growth_interval=500)
        >>> policy.compute_dtype, policy.loss_scaling
        (dtype('float16'), True)
        >>> trainer = fj.Trainer(precision=policy)  # or precision="16-mixed" for the defaults
    """

    name: str = "32-true"
    _: dataclasses.KW_ONLY
    init_scale: float = 2.0**16
    growth_interval: int = 2000
    min_scale: float = 1.0

    def __post_init__(self) -> None:
        name = _ALIASES.get(self.name, self.name)
        if not isinstance(name, str) or name not in _DTYPES:
            raise ValueError(
                f"Trainer(precision=...) got {self.name!r}; use one of {list(_DTYPES)} (Lightning's "
                "names) or a fitjax.Precision."
            )
        object.__setattr__(self, "name", name)
        if not (isinstance(self.growth_interval, int) and self.growth_interval > 0):
            raise ValueError(f"Precision(growth_interval=...) must be a positive int, got {self.growth_interval!r}")
        if not (self.init_scale >= self.min_scale > 0):
            raise ValueError(
                f"Precision needs init_scale >= min_scale > 0, got init_scale={self.init_scale!r}, "
                f"min_scale={self.min_scale!r}"
            )

    @property
    def compute_dtype(self) -> jnp.dtype:
        return jnp.dtype(_DTYPES[self.name][0])

    @property
    def param_dtype(self) -> jnp.dtype:
        return jnp.dtype(_DTYPES[self.name][1])

    @property
    def loss_scaling(self) -> bool:
        return self.name == "16-mixed"

    @property
    def is_default(self) -> bool:
        return self.name == "32-true"

    @property
    def x64(self) -> bool:
        """Whether the policy computes in 64 bits (JAX's `jax_enable_x64` on while it runs)."""
        return self.compute_dtype == jnp.float64

    def context(self) -> contextlib.AbstractContextManager:
        """What the trainer runs its stages inside: 64-bit JAX for "64-true", else nothing.

        Arrays made inside keep float64 after it, but a jitted function called outside it
        computes in 32 bits again (JAX keys its caches on the flag), so every use of the float64
        state goes through a trainer stage."""
        return jax.enable_x64(True) if self.x64 else contextlib.nullcontext()

    # ------------------------------------------------------------------- casts (traced in the step)

    def cast_compute(self, tree: PyTree) -> PyTree:
        """Floating leaves to the compute dtype; integer leaves (labels, indices) untouched."""
        return _cast_floating(tree, self.compute_dtype)

    def cast_params(self, params: PyTree) -> PyTree:
        """Floating leaves to the storage dtype of the parameters."""
        return _cast_floating(params, self.param_dtype)

    def float32_outputs(self) -> contextlib.AbstractContextManager:
        """While tracing inside it, a Linen model's top-level call returns float32 outputs."""
        if self.compute_dtype in (jnp.float32, jnp.float64):  # float64 outputs stay float64
            return contextlib.nullcontext()
        return nn.intercept_methods(_root_outputs_to_float32)

    # --------------------------------------------------------------------------- loss scaling

    def initial_loss_scale(self) -> LossScale | None:
        if not self.loss_scaling:
            return None
        return LossScale(scale=jnp.asarray(self.init_scale, jnp.float32),
                         good_steps=jnp.zeros((), jnp.int32), skipped=jnp.zeros((), jnp.int32))

    def update_loss_scale(self, ls: LossScale, finite: jax.Array) -> LossScale:
        """Halve and reset on a non-finite step; double after `growth_interval` finite ones."""
        good = jnp.where(finite, ls.good_steps + 1, 0)
        grow = good >= self.growth_interval
        scale = jnp.where(finite, jnp.where(grow, ls.scale * 2.0, ls.scale),
                          jnp.maximum(ls.scale * 0.5, self.min_scale))
        return LossScale(scale=scale, good_steps=jnp.where(grow, 0, good),
                         skipped=ls.skipped + (~finite).astype(jnp.int32))


_calls = threading.local()  # how deep in intercepted Linen calls this thread's trace is


def _root_outputs_to_float32(next_fun, args, kwargs, context):
    # the root is the outermost call: a module inside a lifted transform (`nn.scan` over layers,
    # `nn.remat`) also has a Scope for parent, and its carry must keep its dtype
    depth = getattr(_calls, "depth", 0)
    _calls.depth = depth + 1
    try:
        out = next_fun(*args, **kwargs)
    finally:
        _calls.depth = depth
    if depth == 0 and context.method_name == "__call__" and not isinstance(context.module.parent, nn.Module):
        out = _cast_floating(out, jnp.float32)
    return out


def _cast_floating(tree: PyTree, dtype) -> PyTree:
    def cast(x):
        if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != dtype:
            return x.astype(dtype)
        return x

    return jax.tree.map(cast, tree)


def resolve(precision: Any) -> Precision:
    """`Trainer(precision=...)` -> a `Precision` (a string, 16/32, or an instance)."""
    if isinstance(precision, Precision):
        return precision
    if isinstance(precision, (str, int)) and not isinstance(precision, bool):
        return Precision(precision)
    raise ValueError(
        f"Trainer(precision=...) got {precision!r}; use one of {list(_DTYPES)} (Lightning's names) "
        "or a fitjax.Precision."
    )
