"""Several flax models on one module (`self.net` and `self.target_net`), each bound by its
attribute name in `loss` and `training_step`, with no wrapper module: each is a top-level
parameter group, so `{name: tx}` optimizers and `{name: loss}` manual optimization apply.
Writing weights from a host hook, `self.update_params(fn)` (a DQN's target sync every n steps),
equals a hand-written loop's, keeps the parameters' shardings, is in checkpoints and resumes
bitwise."""

from __future__ import annotations

import flax.linen as nn
import jax
import numpy as np
import optax
import pytest
from flax import nnx

import fitjax as fj
from helpers import assert_trees_close

SYNC_RATE = 2


def _batches(n=3):
    rng = np.random.default_rng(0)
    return [{"x": rng.normal(size=(4, 2)).astype(np.float32), "y": rng.normal(size=(4, 1)).astype(np.float32)}
            for _ in range(n)]


def _loss(net, target_net, batch):
    # the target's output enters the regression target, as a DQN's does; no gradient flows to it
    target = batch["y"] + 0.5 * jax.lax.stop_gradient(target_net(batch["x"]))
    return ((net(batch["x"]) - target) ** 2).mean()


class TwoNets(fj.LitModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Dense(1)
        self.target_net = nn.Dense(1)

    def loss(self, model, batch):
        assert model.net is self.net and model["target_net"] is self.target_net  # bound by name
        return _loss(self.net, self.target_net, batch)

    def configure_optimizers(self):
        return {"net": optax.sgd(0.1), "target_net": optax.set_to_zero()}  # groups are the names


def _trainer(**kwargs):
    return fj.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, devices=1, **kwargs)


def test_two_models_bound_by_name_train_as_a_hand_written_loop():
    start = TwoNets()
    _trainer(max_steps=0).fit(start, _batches())
    params, _ = start.variables
    assert set(params) == {"net", "target_net"}

    module = TwoNets()
    _trainer(max_epochs=1).fit(module, _batches())

    dense = nn.Dense(1)
    apply = lambda p: (lambda x: dense.apply({"params": p}, x))  # noqa: E731
    net, target = params["net"], params["target_net"]
    for batch in _batches():
        grads = jax.grad(lambda p: _loss(apply(p), apply(target), batch))(net)
        net = jax.tree.map(lambda p, g: p - 0.1 * g, net, grads)
    trained, _ = module.variables
    assert_trees_close(trained["net"], net, rtol=1e-5)
    assert_trees_close(trained["target_net"], target, rtol=0, atol=0)  # frozen: `set_to_zero`


class _Net(nnx.Module):
    def __init__(self, rngs):
        self.linear = nnx.Linear(2, 1, rngs=rngs)

    def __call__(self, x):
        return self.linear(x)


def test_lightning_style_linen_and_nnx_models_by_name_in_steps_and_host_hooks():
    seen = []

    class Module(fj.LitModule):
        def __init__(self):
            super().__init__()
            self.generator = nn.Dense(1)
            self.discriminator = _Net(nnx.Rngs(0))

        def training_step(self, batch, batch_idx):
            fake = self.generator(batch["x"])
            d_loss = (self.discriminator(jax.numpy.concatenate([fake[:, :1], batch["y"]], 1) * 0
                                         + batch["x"]) ** 2).mean()
            self.log("d", d_loss)
            return ((fake - batch["y"]) ** 2).mean() + d_loss

        def on_train_epoch_end(self):  # host code calls each model by its name, current weights
            seen.append((np.asarray(self.generator(np.ones((1, 2), np.float32))),
                         np.asarray(self.discriminator(np.ones((1, 2), np.float32)))))

        def configure_optimizers(self):
            return optax.sgd(0.05)

    module = Module()
    trainer = _trainer(max_epochs=1)
    trainer.fit(module, _batches())
    params, _ = module.variables
    generator = nn.Dense(1).apply({"params": params["generator"]}, np.ones((1, 2), np.float32))
    np.testing.assert_allclose(seen[0][0], generator, rtol=1e-6)
    np.testing.assert_allclose(seen[0][1], module.discriminator(np.ones((1, 2), np.float32)), rtol=1e-6)
    assert "d" in trainer.callback_metrics


class TargetSync(TwoNets):
    """Writes weights from a host hook: a DQN's target sync every `SYNC_RATE` steps."""

    def on_train_batch_end(self, outputs, batch, batch_idx):
        if self.global_step % SYNC_RATE == 0:
            self.update_params(lambda p: {**p, "target_net": p["net"]})


class SaveAt(fj.Callback):
    def __init__(self, step, path):
        self.step, self.path = step, path

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.path)


def _dp_trainer(tmp_path, **kwargs):
    return fj.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      devices=2, strategy="dp", default_root_dir=tmp_path, **kwargs)


def test_a_target_sync_from_a_host_hook_equals_a_hand_loop_and_resumes_bitwise(tmp_path):
    start = TargetSync()
    _dp_trainer(tmp_path, max_steps=0).fit(start, _batches(6))
    params, _ = start.variables

    module = TargetSync()
    trainer = _dp_trainer(tmp_path, max_epochs=1, callbacks=[SaveAt(3, tmp_path / "step3")])
    trainer.fit(module, _batches(6))
    state = trainer.state
    assert state.params["target_net"]["kernel"].sharding == state.params["net"]["kernel"].sharding
    assert state.params["target_net"]["kernel"].sharding.mesh.size == 2  # the strategy's placement kept

    dense = nn.Dense(1)
    apply = lambda p: (lambda x: dense.apply({"params": p}, x))  # noqa: E731
    net, target = params["net"], params["target_net"]
    for step, batch in enumerate(_batches(6), 1):
        grads = jax.grad(lambda p: _loss(apply(p), apply(target), batch))(net)
        net = jax.tree.map(lambda p, g: p - 0.1 * g, net, grads)
        if step % SYNC_RATE == 0:
            target = net
    trained, _ = module.variables
    assert_trees_close(trained, {"net": net, "target_net": target}, rtol=1e-5)

    resumed = TargetSync()
    _dp_trainer(tmp_path, max_epochs=1).fit(resumed, _batches(6), ckpt_path=tmp_path / "step3")
    for a, b in zip(jax.tree.leaves(resumed.variables), jax.tree.leaves(module.variables)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # bitwise


def test_update_params_checks_what_it_is_given(tmp_path):
    class Wrong(TargetSync):
        def on_train_batch_end(self, outputs, batch, batch_idx):
            self.update_params(lambda p: {**p, "target_net": {"kernel": np.zeros((3, 1), np.float32),
                                                                 "bias": p["net"]["bias"]}})

    with pytest.raises(ValueError, match=r"Wrong.update_params: the new \['target_net'\]\['kernel'\] is \(3, 1\)"):
        _dp_trainer(tmp_path, max_steps=1).fit(Wrong(), _batches(6))
    with pytest.raises(RuntimeError, match=r"acts on the weights of a running fit"):
        TargetSync().update_params(lambda p: p)
