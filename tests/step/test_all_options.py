"""Every step option at once, on an NNX model, sharded with fsdp: one step, one compilation.

16-mixed (loss scaling) + accumulate 2 + clip + steps_per_execution 2 + grad norm logging +
anomaly checks, for automatic and manual optimization, with batches kept on the device: the
numbers equal the host-batch run bitwise, and a run stopped mid-epoch and resumed from "last"
ends bitwise where the uninterrupted one does.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from helpers import HostBatches, LossHistory, assert_trees_close, count_compiles, quiet_trainer

import fitjax as fj
from fitjax.strategies import FSDP

OPTIONS = dict(precision="16-mixed", accumulate_grad_batches=2, gradient_clip_val=0.5, steps_per_execution=2,
               log_grad_norm=True, detect_anomaly=True)


class Tower(nnx.Module):
    def __init__(self, rngs):
        self.inp, self.out = nnx.Linear(4, 16, rngs=rngs), nnx.Linear(16, 1, rngs=rngs)

    def __call__(self, x):
        return self.out(jnp.tanh(self.inp(x))).astype(jnp.float32)


class Towers(nnx.Module):
    def __init__(self, rngs):
        self.a, self.b = Tower(rngs), Tower(rngs)

    def __call__(self, x):
        return {"a": self.a(x), "b": self.b(x)}


def _losses(out, batch):
    return {"a": ((out["a"] - batch["y"]) ** 2).mean(), "b": ((out["b"] + batch["y"]) ** 2).mean()}


class Automatic(fj.LitModule):
    def __init__(self):
        super().__init__()
        self.model = Towers(nnx.Rngs(0))

    def loss(self, model, batch):
        losses = _losses(model(batch["x"]), batch)
        return losses["a"] + losses["b"]

    def configure_optimizer(self):
        return optax.adam(1e-2)


class Manual(fj.LitModule):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.model = Towers(nnx.Rngs(0))

    def training_step(self, batch, batch_idx):
        return _losses(self.model(batch["x"]), batch)

    def configure_optimizers(self):
        return {"a": optax.adam(1e-2), "b": optax.sgd(0.05)}


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(96, 4)).astype(np.float32)
    return {"x": x, "y": np.sin(x[:, :1] * 2).astype(np.float32)}


def _fit(module_cls, *, device=True, root=None, ckpt_path=None, **kwargs):
    history = LossHistory()
    callbacks = [history]
    if root is not None:
        callbacks.append(fj.ModelCheckpoint(dirpath=root, save_last=True))
        kwargs["enable_checkpointing"] = True
    loader = fj.DataLoader(_data(), batch_size=8, shuffle=True, seed=2)  # 12 batches: 3 calls an epoch
    trainer = quiet_trainer(strategy=FSDP(min_size_to_shard=0), callbacks=callbacks, log_every_n_steps=2,
                            **OPTIONS, **kwargs)
    module = module_cls()
    with count_compiles() as compiles:
        trainer.fit(module, loader if device else HostBatches(loader), ckpt_path=ckpt_path)
    return jax.device_get(module.variables[0]), history.losses, compiles, trainer


@pytest.mark.parametrize("module_cls", [Automatic, Manual])
def test_every_option_at_once(module_cls, tmp_path):
    params, losses, compiles, trainer = _fit(module_cls, max_epochs=3)
    assert trainer.global_step == 3 * 12 // 2
    assert compiles["train_step"] == 1 and compiles["gather"] == 1  # every call picked on device
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]
    assert trainer.callback_metrics["train/grad_norm"] > 0 and "loss_scale" in trainer.callback_metrics

    host, host_losses, _, _ = _fit(module_cls, device=False, max_epochs=3)
    assert_trees_close(params, host, rtol=0, atol=0)
    assert losses == host_losses

    _, first, _, _ = _fit(module_cls, root=tmp_path, max_steps=8)  # mid-epoch 2 (6 steps an epoch)
    resumed, rest, _, _ = _fit(module_cls, root=tmp_path, ckpt_path="last", max_epochs=3)
    assert_trees_close(resumed, params, rtol=0, atol=0)
    assert first + rest == losses
