"""`Trainer(update_in_backward=True)`: each layer of a scanned `CausalLMModule` updated inside the
backward pass. The same parameters, optimizer state, losses and gradient norm as the usual step
(single device and fsdp over the 8 CPU devices), 8-bit and bfloat16 moments with a schedule under
both bf16 policies, exact resume, the errors where it cannot apply, and a deviceless TPU v5e
compile whose peak falls by about the gradients' size."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import LossHistory, assert_trees_close, quiet_trainer

import fitjax as fj
from fitjax import models

pytestmark = pytest.mark.usefixtures("compile_cache")  # tests/conftest.py

LLAMA = {"model_type": "llama", "vocab_size": 64, "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64}
TOKENS = np.random.default_rng(0).integers(0, 64, (16, 17)).astype(np.int32)


class _SGDLlama(models.CausalLMModule):
    # SGD with momentum: its update is linear in the gradient (Adam's first step is lr × sign(g),
    # which turns float rounding of a near-zero gradient into a whole step)
    def configure_optimizer(self):
        return optax.sgd(self.hparams.lr, momentum=0.9)


class _ScheduledLlama(models.CausalLMModule):
    def configure_optimizer(self):
        schedule = optax.warmup_cosine_decay_schedule(0.0, self.hparams.lr, 2, 10)
        return fj.optim.adamw(schedule, moments=self.hparams.moments)


def _fit(module, *, steps=3, callbacks=(), data=None, **kwargs):
    history = LossHistory()
    kwargs.setdefault("strategy", "single")
    trainer = quiet_trainer(max_steps=steps, callbacks=[history, *callbacks], log_every_n_steps=1, **kwargs)
    trainer.fit(module, fj.DataLoader(data or {"tokens": TOKENS}, batch_size=8))
    return trainer, history.losses


@pytest.mark.parametrize("strategy", ["single", "fsdp"])
def test_the_parameters_state_losses_and_grad_norm_are_the_usual_steps(strategy):
    """Packed rows (segment ids): the loss is a `TokenLoss`, each gradient divided by the step's tokens."""
    segments = np.repeat(np.array([[1] * 9 + [2] * 6 + [0] * 2]), len(TOKENS), axis=0).astype(np.int32)
    runs = {}
    for in_backward in (False, True):
        trainer, losses = _fit(_SGDLlama(LLAMA, lr=0.1, scan_layers=True), strategy=strategy, log_grad_norm=True,
                               update_in_backward=in_backward, data={"tokens": TOKENS, "segment_ids": segments})
        runs[in_backward] = trainer, losses, float(trainer.callback_metrics["train/grad_norm"])
    (usual, usual_losses, usual_norm), (fused, losses, norm) = runs[False], runs[True]
    assert len(losses) == 3
    np.testing.assert_allclose(losses, usual_losses, rtol=1e-6)
    assert norm == pytest.approx(usual_norm, rel=1e-6)
    assert_trees_close(fused.state.params, usual.state.params, rtol=0, atol=1e-6)
    assert_trees_close(fused.state.opt_state, usual.state.opt_state, rtol=0, atol=1e-6)
    if strategy == "fsdp":  # the state keeps the strategy's layout
        for got, want in zip(jax.tree.leaves(fused.state), jax.tree.leaves(usual.state)):
            assert got.sharding.is_equivalent_to(want.sharding, got.ndim)


def test_8bit_moments_and_a_schedule_train_as_the_usual_step(moments="int8", precision="bf16-true"):
    """Their stochastic rounding draws other bits (each layer is a leaf of its own there): the loss
    curves agree within the rounding's noise, the state keeps its dtypes."""
    got = {}
    for in_backward in (False, True):
        trainer, losses = _fit(_ScheduledLlama(LLAMA, lr=1e-2, scan_layers=True, moments=moments), steps=4,
                               precision=precision, update_in_backward=in_backward)
        got[in_backward] = trainer, losses
    (usual, usual_losses), (fused, losses) = got[False], got[True]
    np.testing.assert_allclose(losses, usual_losses, rtol=1e-3)
    assert losses[-1] < losses[0]
    mu = fused.state.opt_state[0].mu["layers"]["mlp"]["up_proj"]["kernel"]
    assert mu.dtype == jnp.int8 and mu.shape == (2, 64, 128)
    assert jax.tree.map(lambda a: a.dtype, fused.state.opt_state) == jax.tree.map(lambda a: a.dtype, usual.state.opt_state)
    assert int(fused.state.opt_state[0].count) == 4
    assert_trees_close(fused.state.params, usual.state.params, rtol=0, atol=0.05)


def test_an_interrupted_fit_resumes_exactly(tmp_path):
    """bfloat16 moments under bf16-mixed (float32 master weights, bfloat16 layers)."""
    def fit(steps, **kwargs):
        return _fit(_ScheduledLlama(LLAMA, lr=1e-2, scan_layers=True, moments="bfloat16"), steps=steps,
                    precision="bf16-mixed", update_in_backward=True, **kwargs)

    full, full_losses = fit(4)
    _, first = fit(2, enable_checkpointing=True, callbacks=[fj.ModelCheckpoint(tmp_path)])
    history = LossHistory()
    resumed = quiet_trainer(max_steps=4, strategy="single", precision="bf16-mixed", update_in_backward=True,
                            enable_checkpointing=True, callbacks=[history, fj.ModelCheckpoint(tmp_path)])
    resumed.fit(_ScheduledLlama(LLAMA, lr=1e-2, scan_layers=True, moments="bfloat16"),
                fj.DataLoader({"tokens": TOKENS}, batch_size=8), ckpt_path="last")
    assert first + history.losses == full_losses and full_losses[-1] < full_losses[0]
    assert full.state.opt_state[0].mu["layers"]["mlp"]["up_proj"]["kernel"].dtype == jnp.bfloat16
    assert_trees_close(resumed.state.params, full.state.params, rtol=0, atol=0)
    assert_trees_close(resumed.state.opt_state, full.state.opt_state, rtol=0, atol=0)


@pytest.mark.parametrize("option, value, why", [
    ("accumulate_grad_batches", 2, "summed before any update"),
    ("gradient_clip_val", 1.0, "global-norm clip"),
    ("precision", "16-mixed", "loss-scaled step"),
    ("remat", "dots", "use 'full'"),
    ("detect_anomaly", True, "whole gradient"),
])
def test_what_needs_the_whole_gradient_is_refused_when_the_trainer_is_made(option, value, why):
    with pytest.raises(ValueError, match=rf"Trainer\(update_in_backward=True\) cannot combine with "
                                         rf"{option}={value!r}: .*{why}"):
        fj.Trainer(update_in_backward=True, **{option: value})
    fj.Trainer(update_in_backward=True, gradient_clip_val=1.0, gradient_clip_algorithm="value")  # elementwise
    with pytest.raises(ValueError, match=r"update_in_backward=...\) must be True or False, got 'yes'"):
        fj.Trainer(update_in_backward="yes")


class _ClippedLlama(models.CausalLMModule):
    def configure_optimizer(self):
        return optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3))


def test_an_unscanned_model_or_an_optimizer_reading_the_whole_gradient_is_refused():
    with pytest.raises(ValueError, match=r"called 0 scanned layer stacks .*CausalLMModule\(\.\.\., scan_layers=True\)"):
        _fit(models.CausalLMModule(LLAMA), steps=1, update_in_backward=True)
    with pytest.raises(ValueError, match=r"optimizer computes the update of .* from the gradients of .*global-norm"):
        _fit(_ClippedLlama(LLAMA, scan_layers=True), steps=1, update_in_backward=True)


def test_the_peak_on_a_tpu_v5e_falls_by_about_the_gradients():
    """Deviceless compile for one v5e chip (libtpu), a model whose float32 gradients (102 MB)
    outweigh its activations: the usual step holds most of them at once (measured: 65 MB over
    the state), this one a layer's (9 MB)."""
    config = {**LLAMA, "vocab_size": 256, "hidden_size": 512, "intermediate_size": 2048, "num_hidden_layers": 6,
              "num_attention_heads": 8, "num_key_value_heads": 8}
    batch = {"tokens": jax.ShapeDtypeStruct((2, 33), np.int32)}
    peaks = {}
    for in_backward in (False, True):
        plan = quiet_trainer(update_in_backward=in_backward, remat="full").plan(
            models.CausalLMModule(config, scan_layers=True), batch, target="tpu-v5e-1")
        peaks[in_backward] = plan.candidates[0].memory["peak"]
    params = 4 * (6 * (4 * 512 * 512 + 3 * 512 * 2048 + 2 * 512) + 2 * 256 * 512 + 512)
    state = 3 * params  # float32 parameters and Adam's two moments
    assert peaks[True] - state < 0.15 * params < 0.5 * params < peaks[False] - state, (peaks, params)
