"""`Trainer(remat=...)`: each layer of a Linen model rematerialized in the backward pass.

The same numbers as without it (bitwise here) on single, dp and fsdp; less memory for more FLOPs
where XLA schedules the recomputation late (TPU: planned deviceless for a v5e chip; XLA:CPU
recomputes early and saves nothing, see fitjax/step/remat.py).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import numpy as np
import optax
import pytest
from flax import nnx
from helpers import LossHistory, assert_trees_close, quiet_trainer

import fitjax as fj
from fitjax.strategies import FSDP


class Block(nn.Module):
    width: int

    @nn.compact
    def __call__(self, x):
        return x + nn.Dense(x.shape[-1])(nn.gelu(nn.Dense(self.width)(x)))


class Tower(fj.LitModule):
    def __init__(self, layers=2, width=32):
        super().__init__()
        self.model = nn.Sequential([Block(width) for _ in range(layers)])

    def loss(self, model, batch):
        return ((model(batch["x"]) - batch["y"]) ** 2).mean()

    def configure_optimizer(self):
        return optax.adam(1e-2)


def data(n=64, d=8):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, d)).astype(np.float32)
    return {"x": x, "y": np.tanh(x @ rng.normal(size=(d, d))).astype(np.float32)}


def _fit(strategy, remat):
    history = LossHistory()
    module = Tower()
    quiet_trainer(strategy=strategy, max_steps=3, remat=remat, callbacks=[history]).fit(
        module, fj.DataLoader(data(), batch_size=16))
    return jax.device_get(module.variables[0]), history.losses


@pytest.mark.parametrize("strategy", ["single", "dp", FSDP(min_size_to_shard=0)], ids=["single", "dp", "fsdp"])
def test_remat_gives_the_same_numbers(strategy):
    plain, plain_losses = _fit(strategy, "none")
    for remat in ("full", "dots", "offload"):
        params, losses = _fit(strategy, remat)
        assert_trees_close(params, plain, rtol=0, atol=0)
        assert losses == plain_losses


def test_remat_lowers_temporaries_for_more_flops_on_a_tpu_chip():
    # hidden activations of 2048 x 8192 floats (64 MiB): they outgrow what XLA:TPU (libtpu 0.0.42,
    # as JAX 0.10.2 pins) keeps off its HBM temporaries (32 MiB of them planned 0 bytes);
    # temporaries 0.03x, FLOPs 1.18x. The narrow input and output keep each compile ~5 s
    # (4 layers of 2048 over 8192 rows of 512 also showed it, at ~17 s a compile)
    module = Tower(layers=2, width=8192)
    batch = [{"x": np.zeros((2048, 128), np.float32), "y": np.zeros((2048, 128), np.float32)}]
    plan = fj.plan(module, batch, target="tpu-v5e-1", strategy="single", sweep={"remat": ["none", "full"]})
    none, full = plan.candidates
    assert (none.remat, full.remat) == ("none", "full")
    assert full.memory["temporaries"] < none.memory["temporaries"] / 2
    assert full.xla_flops > none.xla_flops * 1.1
    # the model's FLOPs are the step's without remat: the MFU does not count the recomputation
    assert full.model_flops_source == "xla, no remat" and full.model_flops == pytest.approx(none.xla_flops)


def test_remat_is_checked_and_refused_for_nnx_models():
    with pytest.raises(ValueError, match=r"Trainer\(remat=...\) got 'some'.*'none', 'full', 'dots', 'offload'"):
        fj.Trainer(remat="some")

    class NNXTower(fj.LitModule):
        def __init__(self):
            super().__init__()
            self.model = nnx.Linear(8, 8, rngs=nnx.Rngs(0))

        def loss(self, model, batch):
            return ((model(batch["x"]) - batch["y"]) ** 2).mean()

        def configure_optimizer(self):
            return optax.sgd(0.1)

    with pytest.raises(ValueError, match="nnx.remat"):
        quiet_trainer(max_steps=1, remat="full").fit(NNXTower(), fj.DataLoader(data(), batch_size=16))
