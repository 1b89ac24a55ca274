"""Writing weights from a host hook: `self.update_params(fn)` (a DQN's target sync every n
steps) equals a hand-written loop's, keeps the parameters' shardings, is in checkpoints and
resumes bitwise."""

from __future__ import annotations

import flax.linen as nn
import jax
import numpy as np
import optax
import pytest

import fitjax as fj
from helpers import assert_trees_close

SYNC_RATE = 2


def _batches(n=6):
    rng = np.random.default_rng(0)
    return [{"x": rng.normal(size=(4, 2)).astype(np.float32), "y": rng.normal(size=(4, 1)).astype(np.float32)}
            for _ in range(n)]


def _loss(net, target_net, batch):
    target = batch["y"] + 0.5 * jax.lax.stop_gradient(target_net(batch["x"]))
    return ((net(batch["x"]) - target) ** 2).mean()


class TargetSync(fj.LitModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Dense(1)
        self.target_net = nn.Dense(1)

    def loss(self, model, batch):
        return _loss(self.net, self.target_net, batch)

    def configure_optimizers(self):
        return {"net": optax.sgd(0.1), "target_net": optax.set_to_zero()}

    def on_train_batch_end(self, outputs, batch, batch_idx):
        if self.global_step % SYNC_RATE == 0:
            self.update_params(lambda p: {**p, "target_net": p["net"]})


class SaveAt(fj.Callback):
    def __init__(self, step, path):
        self.step, self.path = step, path

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.path)


def _trainer(tmp_path, **kwargs):
    return fj.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      devices=2, strategy="dp", default_root_dir=tmp_path, **kwargs)


def test_a_target_sync_from_a_host_hook_equals_a_hand_loop_and_resumes_bitwise(tmp_path):
    start = TargetSync()
    _trainer(tmp_path, max_steps=0).fit(start, _batches())
    params, _ = start.variables

    module = TargetSync()
    trainer = _trainer(tmp_path, max_epochs=1, callbacks=[SaveAt(3, tmp_path / "step3")])
    trainer.fit(module, _batches())
    state = trainer.state
    assert state.params["target_net"]["kernel"].sharding == state.params["net"]["kernel"].sharding
    assert state.params["target_net"]["kernel"].sharding.mesh.size == 2  # the strategy's placement kept

    dense = nn.Dense(1)
    apply = lambda p: (lambda x: dense.apply({"params": p}, x))  # noqa: E731
    net, target = params["net"], params["target_net"]
    for step, batch in enumerate(_batches(), 1):
        grads = jax.grad(lambda p: _loss(apply(p), apply(target), batch))(net)
        net = jax.tree.map(lambda p, g: p - 0.1 * g, net, grads)
        if step % SYNC_RATE == 0:
            target = net
    trained, _ = module.variables
    assert_trees_close(trained, {"net": net, "target_net": target}, rtol=1e-5)

    resumed = TargetSync()
    _trainer(tmp_path, max_epochs=1).fit(resumed, _batches(), ckpt_path=tmp_path / "step3")
    for a, b in zip(jax.tree.leaves(resumed.variables), jax.tree.leaves(module.variables)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # bitwise


def test_update_params_checks_what_it_is_given(tmp_path):
    class Wrong(TargetSync):
        def on_train_batch_end(self, outputs, batch, batch_idx):
            self.update_params(lambda p: {**p, "target_net": {"kernel": np.zeros((3, 1), np.float32),
                                                                 "bias": p["net"]["bias"]}})

    with pytest.raises(ValueError, match=r"Wrong.update_params: the new \['target_net'\]\['kernel'\] is \(3, 1\)"):
        _trainer(tmp_path, max_steps=1).fit(Wrong(), _batches())
    with pytest.raises(RuntimeError, match=r"acts on the weights of a running fit"):
        TargetSync().update_params(lambda p: p)
