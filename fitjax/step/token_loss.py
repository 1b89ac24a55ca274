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

__all__ = ["PADDING_MARKS", "TokenLoss", "real_rows", "split_token_loss"]

# the per-token marks that say which slots of a row hold data (0: padding): `TextLoader`'s
# segment ids, Hugging Face's attention mask
PADDING_MARKS = ("segment_ids", "attention_mask")


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


def real_rows(batch: Any) -> jax.Array:
    """1.0 for each row of `batch` that holds data, 0.0 for a row that is all padding by the
    batch's own marks (`PADDING_MARKS`, [batch, length]: every slot 0, as the rows `TextLoader`
    fills an epoch's last batch with); 1.0 everywhere for a batch without such marks. Traceable.

    Example:
        >>> import numpy as np
        >>> real_rows({"segment_ids": np.array([[1, 1, 0], [0, 0, 0]])}).tolist()
        [1.0, 0.0]
    """
    rows = len(jax.tree.leaves(batch)[0])
    marks = batch.get(next((k for k in PADDING_MARKS if k in batch), None)) if isinstance(batch, dict) else None
    if marks is None or jnp.ndim(marks) != 2:
        return jnp.ones((rows,), jnp.float32)
    return jnp.any(jnp.asarray(marks) != 0, axis=1).astype(jnp.float32)
