"""Resume on other hardware: a checkpoint saved under one strategy, device count or number of
processes resumes under another and sees the same examples in the same order (the data position
is global: batches of the same global batch consumed), training the same numbers to float32
rounding (the reductions run in another order). A batch that does not divide over the new
devices is refused before anything is restored.

One uninterrupted fit (dp on 8 devices, 8 steps, a checkpoint at step 4) is shared by every case.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import optax
import pytest
from flax import linen as nn
from helpers import Regressor, assert_trees_close, quiet_trainer
from resume_parts import fit

import fitjax as fj

HERE = Path(__file__).resolve().parent
WORKTREE = HERE.parents[1]

pytestmark = pytest.mark.usefixtures("compile_cache")  # tests/conftest.py


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """8 steps with dp on 8 devices, saving at step 4 (inside epoch 1): (what it saw, its module,
    the step-4 checkpoint)."""
    folder = tmp_path_factory.mktemp("straight")
    saves = fj.ModelCheckpoint(folder, every_n_train_steps=4, save_top_k=-1)
    _, seen, module = fit(strategy="dp", max_steps=8, callbacks=[saves])
    return seen, module, folder / "epoch=1-step=4"


def _devices(trainer) -> int:
    return len(jax.tree.leaves(trainer.state.params)[0].sharding.device_set)


def _assert_continues(straight, rows, losses, module, *, start=4):
    """What the resumed fits saw and trained is what the straight fit did from step `start`."""
    seen, straight_module, _ = straight
    assert len(rows) == len(seen.rows) - start
    for step, (got, want) in enumerate(zip(rows, seen.rows[start:]), start + 1):
        np.testing.assert_array_equal(got, want, err_msg=f"the examples of step {step}")
    np.testing.assert_allclose(losses, seen.losses[start:], rtol=1e-5, atol=1e-6)
    assert_trees_close(module.variables, straight_module.variables, rtol=1e-5, atol=1e-6)


def test_dp_on_8_resumes_as_fsdp_on_4_then_zero1_on_1_then_dp_on_8(tmp_path, straight):
    ckpt, rows, losses = straight[2], [], []
    for strategy, devices, steps in [("fsdp", 4, 6), ("zero1", 1, 7), ("dp", 8, 8)]:  # an epoch's end, inside one
        trainer, seen, module = fit(strategy=strategy, devices=devices, max_steps=steps, ckpt_path=ckpt)
        assert trainer.global_step == steps and _devices(trainer) == devices
        ckpt = tmp_path / f"{strategy}-{steps}"
        trainer.save_checkpoint(ckpt)
        rows, losses = rows + seen.rows, losses + seen.losses
    _assert_continues(straight, rows, losses, module)


def test_a_batch_that_does_not_divide_over_the_new_devices_is_refused_before_restoring(straight):
    with pytest.raises(ValueError, match=r"batch size of 32, which does not divide over the 3 devices.*keeps the "
                                         r"global batch size it was saved with.*divides 32"):
        fit(strategy="dp", devices=3, max_steps=8, ckpt_path=straight[2])


def test_two_processes_resume_one_and_one_resumes_them(tmp_path, straight):
    """The step-4 checkpoint of one process resumed by 2 processes (fsdp, 4 devices each) to
    step 6, and theirs by one process (dp on 4 devices) to step 8."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(WORKTREE), str(HERE)])}
    proc = subprocess.run([sys.executable, "-m", "fitjax.cli", "launch", "--nproc", "2", "--devices-per-process",
                           "4", str(HERE / "resume_worker.py"), str(straight[2]), "6", "fsdp", str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    two = [pickle.loads((tmp_path / f"process_{i}.pkl").read_bytes()) for i in range(2)]
    assert two[0]["losses"] == two[1]["losses"]  # the global loss and batch, on each process
    rows = two[0]["rows"]
    for a, b in zip(rows, two[1]["rows"]):
        np.testing.assert_array_equal(a, b)
    trainer, seen, module = fit(strategy="dp", devices=4, max_steps=8, ckpt_path=tmp_path / "saved")
    assert trainer.global_step == 8 and _devices(trainer) == 4
    _assert_continues(straight, rows + seen.rows, two[0]["losses"] + seen.losses, module)


def test_a_many_runs_checkpoint_of_dp_on_8_resumes_with_the_runs_split_over_2_devices(tmp_path):
    runs = [{"lr": 0.05}, {"lr": 0.02}]
    saves = fj.ModelCheckpoint(tmp_path, every_n_train_steps=2, save_top_k=-1)
    whole, _, _ = fit(strategy="dp", max_steps=4, runs=runs, callbacks=[saves])
    resumed, _, _ = fit(strategy="runs", devices=2, max_steps=4, runs=runs, ckpt_path=tmp_path / "epoch=0-step=2")
    assert resumed.global_step == 4 and _devices(resumed) == 2
    assert_trees_close(resumed.state.params, whole.state.params, rtol=1e-5, atol=1e-6)
    assert_trees_close(resumed.state.opt_state, whole.state.opt_state, rtol=1e-5, atol=1e-6)


class _Net(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool = False):
        return nn.Dense(1, name="down")(nn.relu(nn.Dense(16, name="up")(x)))


class _Adapted(Regressor):
    """The regression through LoRA adapters (rank 2) on a fixed random base."""

    def __init__(self):
        super().__init__(batchnorm=False)
        self.model = _Net()
        self.load_weights(jax.device_get(_Net().init(jax.random.key(1), np.zeros((1, 8), np.float32))["params"]))
        self.apply_lora(r".*", rank=2)

    def configure_optimizer(self):
        return optax.adam(1e-2)


def test_a_lora_checkpoint_of_dp_on_8_resumes_as_fsdp_on_4(tmp_path):
    saves = fj.ModelCheckpoint(tmp_path, every_n_train_steps=2, save_top_k=-1, weights="trainable")
    whole, seen, module = fit(strategy="dp", max_steps=4, module=_Adapted(), callbacks=[saves])
    resumed, again, resumed_module = fit(strategy="fsdp", devices=4, max_steps=4, module=_Adapted(),
                                         ckpt_path=tmp_path / "epoch=0-step=2")
    assert resumed.global_step == 4 and _devices(resumed) == 4
    for got, want in zip(again.rows, seen.rows[2:]):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(again.losses, seen.losses[2:], rtol=1e-5, atol=1e-6)
    assert_trees_close(resumed.state.params, whole.state.params, rtol=1e-5, atol=1e-6)
    assert_trees_close(resumed_module.variables, module.variables, rtol=1e-5, atol=1e-6)
