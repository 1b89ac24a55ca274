"""Optimizers whose state takes less memory, as optax transformations: Adam with its moments in
bfloat16 or 8-bit block-wise (`fj.optim.adamw(lr, moments="int8")`), returned from
`configure_optimizer` like any optax optimizer."""

from fitjax.optim._adam import ScaleByAdamBlockwiseState, StackSlice, adam, adamw, scale_by_adam

__all__ = ["ScaleByAdamBlockwiseState", "StackSlice", "adam", "adamw", "scale_by_adam"]
