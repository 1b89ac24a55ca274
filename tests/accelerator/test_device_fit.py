"""A fit on the device JAX finds first (a TPU or GPU where there is one; on a CPU-only machine,
a CPU device) against the same fit in float32 on the host's CPU, in one process.

Run on an accelerator with `python -m pytest tests/accelerator`; CI runs it on CPU. The device's
fit trains in bf16-mixed with every option that changes the step (gradient accumulation, several
steps a call, an EMA of the weights, a metric), so its losses follow the float32 ones to bf16's
precision: `BF16_RTOL`, relative, per step. A checkpoint written on the device is restored on
the CPU and continued there, and the CPU's checkpoint is restored on the device: each restore
gives the saved arrays bit for bit, on the restoring platform's device.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from _lm import LENGTH, LM, VOCAB, device_of, host, rows
from helpers import LossHistory, quiet_trainer

import fitjax as fj

DEVICE, CPU = jax.devices()[0], jax.devices("cpu")[0]
# bf16 keeps 8 bits of mantissa (0.4% per rounding); 8 optimizer steps of Adam at 1e-2 from the
# same initial weights drift further apart than one rounding: measured on CPU, at most 0.6%
BF16_RTOL = 3e-2
# 4 calls of 2 optimizer steps of 2 micro-batches of 4 rows
OPTIONS = dict(accumulate_grad_batches=2, steps_per_execution=2, log_every_n_steps=2)
pytestmark = pytest.mark.usefixtures("compile_cache")  # a program the fits share compiles once


class _StartState(fj.Callback):
    """The parameters a fit starts from (after a restore), on the host."""

    def on_fit_start(self, trainer, module):
        self.params, self.devices = host(trainer.state.params), device_of(trainer.state.params)


def _fit(device, precision: str, root, *, steps: int = 8, ckpt_path=None, evaluate: bool = False):
    # a program for the CPU is traced with the plain attention: on a TPU host "auto" picks the TPU's kernel
    module, history, start = LM("auto" if device is DEVICE else "xla"), LossHistory(), _StartState()
    trainer = quiet_trainer(accelerator=device.platform, devices=1, precision=precision, seed=0, max_steps=steps,
                            default_root_dir=str(root), enable_checkpointing=True,
                            callbacks=[history, start, fj.EMA(decay=0.5)], **OPTIONS)
    trainer.fit(module, fj.DataLoader(rows(32), batch_size=4, shuffle=True, seed=0, drop_last=True),
                ckpt_path=ckpt_path)
    result = dict(trainer=trainer, losses=history.losses, start=start)
    if evaluate:
        val = fj.DataLoader(rows(8, seed=1), batch_size=4)
        (result["metrics"],) = trainer.validate(module, val, verbose=False)
        result["predictions"] = np.concatenate([np.asarray(p).reshape(-1, LENGTH, VOCAB)
                                                for p in trainer.predict(module, val)])
    return result


@pytest.fixture(scope="module")
def fits(tmp_path_factory):
    root = tmp_path_factory.mktemp("fits")
    return (_fit(DEVICE, "bf16-mixed", root / "device", evaluate=True),
            _fit(CPU, "32-true", root / "cpu", evaluate=True))


def test_bf16_losses_on_the_device_follow_a_float32_fit_on_cpu(fits):
    device, cpu = fits
    assert device_of(device["trainer"].state.params) == {DEVICE}
    assert device_of(cpu["trainer"].state.params) == {CPU}
    assert len(device["losses"]) == len(cpu["losses"]) == 4  # one a call
    np.testing.assert_allclose(device["losses"], cpu["losses"], rtol=BF16_RTOL)
    assert device["losses"][-1] < 0.6 * device["losses"][0]  # it learns: each token is the previous one plus one


def test_metrics_predictions_and_the_ema_follow_the_float32_fit(fits):
    device, cpu = fits
    assert device["metrics"]["val/loss"] == pytest.approx(cpu["metrics"]["val/loss"], rel=BF16_RTOL)
    assert device["metrics"]["val/acc"] == pytest.approx(cpu["metrics"]["val/acc"], abs=0.05)
    predictions, want = device["predictions"], cpu["predictions"]
    assert predictions.shape == want.shape == (8, 128, 64)
    # logits of the EMA's weights (`use_for_eval`), computed in bf16: to bf16's precision of their scale
    np.testing.assert_allclose(predictions, want, atol=BF16_RTOL * np.abs(want).max())
    ema, want_ema = host(device["trainer"].state.extras["ema"]), host(cpu["trainer"].state.extras["ema"])
    # as a whole: Adam moves a weight whose gradient is near 0 by +-lr whatever its size, so bf16's
    # rounding can flip a few single weights' steps (measured: 4 of 4,096 by ~0.01)
    for got, expected in zip(jax.tree.leaves(ema), jax.tree.leaves(want_ema), strict=True):
        assert got.dtype == expected.dtype == np.float32
        assert np.linalg.norm(got - expected) <= BF16_RTOL * np.linalg.norm(expected)


def test_a_checkpoint_from_the_device_continues_on_cpu_and_back(fits, tmp_path):
    device = fits[0]["trainer"]
    on_cpu = _fit(CPU, "bf16-mixed", tmp_path / "cpu", steps=10, ckpt_path=device.checkpoint_callback.last_model_path)
    assert on_cpu["start"].devices == {CPU} and on_cpu["trainer"].global_step == 10
    jax.tree.map(np.testing.assert_array_equal, on_cpu["start"].params, host(device.state.params))

    cpu_state = host(on_cpu["trainer"].state.params)
    back = _fit(DEVICE, "bf16-mixed", tmp_path / "back", steps=12,
                ckpt_path=on_cpu["trainer"].checkpoint_callback.last_model_path)
    assert back["start"].devices == {DEVICE} and back["trainer"].global_step == 12
    jax.tree.map(np.testing.assert_array_equal, back["start"].params, cpu_state)
    assert all(np.isfinite(loss) for loss in back["losses"])


def test_the_default_checkpoint_waits_for_its_writes_only_where_the_host_runs_the_step(fits):
    """On CPU each epoch-end save is waited for (a write beside the loop slows the step there);
    on an accelerator the loop goes on while the state it copied to the host is written."""
    device, cpu = (fit["trainer"].checkpoint_callback for fit in fits)
    assert cpu.save_seconds > 0 and cpu.write_wait_seconds > 0
    assert device.save_seconds > 0
    if DEVICE.platform == "cpu":
        assert device.write_wait_seconds > 0
    else:
        assert device.write_wait_seconds == 0
