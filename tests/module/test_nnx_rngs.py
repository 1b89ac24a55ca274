"""NNX code that takes its randomness per call gets the step's keys from `self.step_rngs()`:
new dropout masks every step, the same ones on a resume; an `nnx.Rngs(0)` made inside the
traced step (the same mask every step) is refused with the fix."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import fitjax as fj


class Net(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.linear = nnx.Linear(8, 1, rngs=rngs)
        self.dropout = nnx.Dropout(0.5)

    def __call__(self, x, rngs: nnx.Rngs):
        return self.linear(self.dropout(x, rngs=rngs))


class Regressor(fj.LitModule):
    fixed_seed = False

    def __init__(self):
        super().__init__()
        self.model = Net(nnx.Rngs(0))

    def loss(self, model, batch):
        rngs = nnx.Rngs(0) if self.fixed_seed else self.step_rngs()
        kept = model.dropout(jnp.ones((4, 8)), rngs=rngs)  # the step's mask, as a number
        self.log("mask", (kept * jnp.arange(32.0).reshape(4, 8)).sum())
        return ((model(batch["x"], rngs=rngs) - batch["y"]) ** 2).mean()

    def configure_optimizer(self):
        return optax.sgd(0.01)


class Masks(fj.Callback):
    """Records each step's mask number; saves a checkpoint after step `save_at` (mid-epoch)."""

    def __init__(self, save_at=None, path=None):
        self.seen, self.save_at, self.path = [], save_at, path

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.seen.append(float(outputs["mask"]))
        if trainer.global_step == self.save_at:
            trainer.save_checkpoint(self.path)


def _data():
    rng = np.random.default_rng(0)
    return [{"x": rng.normal(size=(4, 8)).astype(np.float32), "y": rng.normal(size=(4, 1)).astype(np.float32)}
            for _ in range(4)]


def _trainer(tmp_path, max_steps, masks):
    return fj.Trainer(max_steps=max_steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, devices=1, callbacks=[masks], default_root_dir=tmp_path)


def test_step_rngs_give_new_masks_every_step_and_the_same_on_resume(tmp_path):
    straight, straight_masks = Regressor(), Masks(save_at=2, path=tmp_path / "step2")
    _trainer(tmp_path, 4, straight_masks).fit(straight, _data())
    assert len(set(straight_masks.seen)) == 4  # a new dropout mask at every step

    module, resumed = Regressor(), Masks()
    _trainer(tmp_path, 4, resumed).fit(module, _data(), ckpt_path=tmp_path / "step2")
    assert resumed.seen == straight_masks.seen[2:]
    for a, b in zip(jax.tree.leaves(module.variables), jax.tree.leaves(straight.variables)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # bitwise


def test_an_nnx_rngs_with_a_fixed_seed_inside_the_step_is_refused_with_the_fix(tmp_path):
    module = Regressor()
    module.fixed_seed = True
    with pytest.raises(TypeError, match=r"`nnx.Rngs\(0\)` was made inside the traced step.*same dropout mask"
                                        r".*self\.step_rngs\(\)"):
        _trainer(tmp_path, 1, Masks()).fit(module, _data())


def test_step_rngs_outside_a_traced_step_says_where_to_call_it():
    with pytest.raises(RuntimeError, match=r"Regressor\.step_rngs\(\) gives the keys of the step being traced"):
        Regressor().step_rngs()
