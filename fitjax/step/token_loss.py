"""`TokenLoss`: a loss given as a sum over tokens and their count, so that accumulation is exact.

Lightning (and fitjax for a plain scalar loss) divides each micro-batch's loss by
`accumulate_grad_batches`: every micro-batch weighs the same whatever it holds. For masked or
packed sequences the micro-batches hold different numbers of real tokens, so the mean of
micro-batch means is not the mean over the tokens of the whole step. A `loss` returning
`fj.TokenLoss(sum=..., count=...)` gets the step's gradient as `grad(Σ sums) / Σ counts` over all
its micro-batches: N micro-batches give exactly one big batch's gradient (up to float summation
order), and the logged loss is `Σ sums / Σ counts`.
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

__all__ = ["TokenLoss", "split_token_loss"]


@flax.struct.dataclass
class TokenLoss:
    """A loss as `sum` (over the batch's real tokens or examples) and `count` (how many).

    Example:
        >>> import fitjax as fj, jax.numpy as jnp, optax
        >>> class LM(fj.LitModule):
        ...     def loss(self, model, batch):
        ...         per_token = optax.softmax_cross_entropy_with_integer_labels(
        ...             model(batch["tokens"]), batch["targets"])
        ...         mask = batch["mask"]  # 1 for real tokens, 0 for padding
        ...         return fj.TokenLoss(sum=(per_token * mask).sum(), count=mask.sum())
    """

    sum: jax.Array
    count: jax.Array

    @property
    def mean(self) -> jax.Array:
        """`sum / count` (0 for a batch with no tokens)."""
        count = jnp.asarray(self.count, jnp.float32)
        return jnp.asarray(self.sum, jnp.float32) / jnp.maximum(count, 1.0)


def split_token_loss(loss: Any) -> tuple[Any, jax.Array | None]:
    """`(value to differentiate, count)`: a `TokenLoss`'s sum and count, or `(loss, None)`."""
    if isinstance(loss, TokenLoss):
        return loss.sum, jnp.asarray(loss.count, jnp.float32)
    return loss, None
