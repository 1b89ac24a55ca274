"""The whole TrainState in a checkpoint: every field saved and restored generically, and restores
across other options refused with an error naming the field and the option."""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from helpers import LossHistory, Poisoned, assert_trees_close, poisoned_data, quiet_trainer

import fitjax as fj
from fitjax import checkpoint

# loss scale 16 at the start, doubled after every 2 finite steps: a scale reset by a resume shows
SCALED = fj.Precision("16-mixed", init_scale=16.0, growth_interval=2)


def _fit(folder, *, max_steps, ckpt_path=None, precision=SCALED, optimizer="sgd", strategy="single"):
    history = LossHistory()
    trainer = quiet_trainer(max_steps=max_steps, strategy=strategy, precision=precision,
                            enable_checkpointing=True,
                            callbacks=[history, fj.ModelCheckpoint(folder, every_n_train_steps=3)])
    module = Poisoned(optimizer=optimizer)
    trainer.fit(module, fj.DataLoader(poisoned_data(), batch_size=16), ckpt_path=ckpt_path)
    return trainer, module, history.losses


pytestmark = pytest.mark.usefixtures("compile_cache")  # tests/conftest.py


def test_16_mixed_resumes_from_last_with_its_loss_scale_bitwise(tmp_path):
    """Data parallel on 8 devices: the loss scale is replicated like the rest of the state."""
    strategy = "dp"
    full, full_module, full_losses = _fit(tmp_path / "full", max_steps=7, strategy=strategy)
    assert float(full.state.loss_scale.scale) == 16.0 * 2 ** 3

    _, _, first = _fit(tmp_path / "cut", max_steps=3, strategy=strategy)
    second, module, rest = _fit(tmp_path / "cut", max_steps=7, ckpt_path="last", strategy=strategy)
    assert first + rest == full_losses
    assert_trees_close(second.state.loss_scale, full.state.loss_scale, rtol=0, atol=0)
    assert_trees_close(module.variables, full_module.variables, rtol=0, atol=0)


def test_another_precision_names_the_loss_scale_and_both_options(tmp_path):
    _fit(tmp_path / "f32", max_steps=3, precision="32-true")
    with pytest.raises(ValueError, match=r"this checkpoint has no loss scale: it was saved with "
                                         r"precision='32-true', and this run uses precision='16-mixed'"):
        _fit(tmp_path / "f32", max_steps=6, ckpt_path="last")

    _fit(tmp_path / "f16", max_steps=3)
    with pytest.raises(ValueError, match=r"has a loss scale \(TrainState.loss_scale\): it was saved with "
                                         r"precision='16-mixed', and this run, with precision='bf16-mixed'"):
        _fit(tmp_path / "f16", max_steps=6, ckpt_path="last", precision="bf16-mixed")


def test_another_optimizer_names_the_optimizer_state_not_the_module(tmp_path):
    _fit(tmp_path, max_steps=3, precision="32-true", optimizer="adam")
    with pytest.raises(ValueError, match=r"optimizer state.*'opt_state/0/count'.*The optimizer differs") as error:
        _fit(tmp_path, max_steps=6, ckpt_path="last", precision="32-true", optimizer="sgd")
    assert "module changed" not in str(error.value)


@flax.struct.dataclass
class _WithEma(fj.TrainState):
    """The state as a later feature may grow it: one more field, here a tree of weights."""

    ema: dict = None


def _state(**fields):
    key = jax.random.key(7)
    base = dict(step=jnp.int32(5), params={"w": jnp.arange(6.0).reshape(2, 3)}, model_state={},
                opt_state=(), rng=key, metrics={"loss": jnp.float32(1.5)})
    return _WithEma(**{**base, **fields})


def _save(path, state):
    with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as saver:
        saver.save(path, args=checkpoint.save_args(state, {"global_step": 5}))


def test_a_field_added_to_the_state_is_saved_and_restored_without_code_for_it(tmp_path):
    state = _state(ema={"w": jnp.full((2, 3), 0.25)}, rng=jax.random.split(jax.random.key(3), 4))
    _save(tmp_path / "a", state)
    like = _state(ema={"w": jnp.zeros((2, 3))})
    like = like.replace(rng=jax.random.split(jax.random.key(0), 4))
    restored = checkpoint.restore_state(tmp_path / "a", like)
    assert isinstance(restored, _WithEma)
    assert_trees_close(restored.ema, state.ema, rtol=0, atol=0)
    assert_trees_close(restored.params, state.params, rtol=0, atol=0)
    np.testing.assert_array_equal(jax.random.key_data(restored.rng), jax.random.key_data(state.rng))
    # Orbax alone reads every field, a typed key as its uint32 data
    plain = ocp.StandardCheckpointer().restore(tmp_path / "a" / "state")
    assert sorted(plain) == ["ema", "metrics", "model_state", "opt_state", "params", "rng", "step"]

    with pytest.raises(ValueError, match=r"has TrainState.ema \('ema'\) and this run has none"):
        checkpoint.restore_state(tmp_path / "a", _state())
    _save(tmp_path / "b", _state())
    with pytest.raises(ValueError, match=r"has no TrainState.ema \('ema'\) and this run has one"):
        checkpoint.restore_state(tmp_path / "b", like)
