"""`fj.TokenLoss`: accumulation weighted by tokens, so ragged micro-batches equal one big batch.

Lightning divides each micro-batch's mean loss by `accumulate_grad_batches` (equal weights): with
masked sequences whose micro-batches hold different numbers of real tokens that is not the mean
over the step's tokens. A loss returned as `TokenLoss(sum, count)` is exact.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import numpy as np
import optax
import pytest
from helpers import LossHistory, assert_trees_close, quiet_trainer

import fitjax as fj

ROWS, LENGTH, MICRO = 32, 6, 4  # 4 micro-batches of 8 rows (one per device)


class TokenRegression(fj.LitModule):
    """Per-token squared error over masked sequences, as a token sum and count (or their mean)."""

    def __init__(self, weighted: bool = True):
        super().__init__()
        self.weighted = weighted
        self.model = nn.Dense(1)

    def loss(self, model, batch):
        per_token = ((model(batch["x"])[..., 0] - batch["y"]) ** 2)
        mask = batch["mask"]
        if self.weighted:
            return fj.TokenLoss(sum=(per_token * mask).sum(), count=mask.sum())
        return (per_token * mask).sum() / mask.sum()  # each micro-batch's own mean

    def configure_optimizer(self):
        return optax.sgd(0.1)


def ragged():
    """Rows whose real lengths differ a lot between micro-batches (1 to 6 tokens of 6)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, LENGTH, 3)).astype(np.float32)
    y = rng.normal(size=(ROWS, LENGTH)).astype(np.float32)
    lengths = np.repeat([1, 6, 2, 5], ROWS // MICRO)  # micro-batch i holds rows [8i, 8i + 8)
    mask = (np.arange(LENGTH)[None, :] < lengths[:, None]).astype(np.float32)
    return {"x": x, "y": y, "mask": mask}


def _fit(strategy, batch_size, accumulate, weighted=True):
    history = LossHistory()
    module = TokenRegression(weighted)
    trainer = quiet_trainer(strategy=strategy, max_steps=1, accumulate_grad_batches=accumulate,
                            callbacks=[history], log_every_n_steps=1)
    trainer.fit(module, fj.DataLoader(ragged(), batch_size=batch_size))
    return jax.device_get(module.variables[0]), history.losses


@pytest.mark.parametrize("strategy", ["single", "dp", "fsdp"])
def test_four_ragged_micro_batches_equal_one_batch_of_all_their_tokens(strategy):
    accumulated, acc_losses = _fit(strategy, ROWS // MICRO, MICRO)
    whole, whole_losses = _fit(strategy, ROWS, 1)
    assert_trees_close(accumulated, whole, rtol=1e-6, atol=1e-7)  # float summation order only
    np.testing.assert_allclose(acc_losses, whole_losses, rtol=1e-6)
    # the token mean over the step, not the mean of micro-batch means
    equal_weights, _ = _fit(strategy, ROWS // MICRO, MICRO, weighted=False)
    assert not np.allclose(jax.tree.leaves(equal_weights)[1], jax.tree.leaves(whole)[1], rtol=1e-3)
