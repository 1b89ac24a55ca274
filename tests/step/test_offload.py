"""`Trainer(offload=...)`: the optimizer state (and master weights) in pinned host memory between
steps, through XLA:CPU's memory kinds: the same losses as without it, the state's leaves in host
memory, exact resume from a checkpoint, the planner counting the bytes as host memory."""

from __future__ import annotations

import flax.linen as nn
import jax
import pytest
import numpy as np
from helpers import LossHistory, TinyLMModule, assert_trees_close, quiet_trainer, regression_data

import fitjax as fj
from fitjax.strategies import HOST, check_host_memory

_KINDS = sorted(m.kind for m in jax.devices()[0].addressable_memories())
pytestmark = [pytest.mark.usefixtures("compile_cache"),  # tests/conftest.py
              pytest.mark.skipif(HOST not in _KINDS, reason=f"this JAX's CPU devices have no {HOST!r} memory "
                                 f"(only {_KINDS}): offload cannot run on them")]

DATA = regression_data(n=64)  # 2 batches of 32 an epoch


class Tower(fj.LitModule):
    def __init__(self, moments: str = "float32"):
        super().__init__()
        self.moments = moments
        self.model = nn.Sequential([nn.Dense(64), nn.relu, nn.Dense(64), nn.relu, nn.Dense(1)])

    def loss(self, model, batch):
        return ((model(batch["x"]) - batch["y"]) ** 2).mean()

    def predict_step(self, model, batch):
        return model(batch["x"])

    def configure_optimizer(self):
        return fj.optim.adamw(3e-3, weight_decay=1e-4, moments=self.moments)


def _loader():
    return fj.DataLoader(DATA, batch_size=32, shuffle=True, seed=3)


def _kinds(tree) -> set[str]:
    return {leaf.sharding.memory_kind for leaf in jax.tree.leaves(tree)}


def _fit(offload: str = "none", moments: str = "float32", **kwargs):
    history = LossHistory()
    trainer = quiet_trainer(callbacks=[history, *kwargs.pop("callbacks", [])], offload=offload, **kwargs)
    module = Tower(moments)
    trainer.fit(module, _loader())
    return trainer, module, history.losses


def test_a_wrong_value_names_the_argument_and_the_values():
    with pytest.raises(ValueError, match=r"Trainer\(offload=...\) got 'gpu'; use one of \['none', 'optimizer'"):
        fj.Trainer(offload="gpu")


class _DeviceMemory:
    kind = "device"


class _NoHostMemory:
    """What a device of a platform without host memory kinds says (none runs here to ask)."""

    platform, device_kind = "metal", "Apple M2"

    def addressable_memories(self):
        return [_DeviceMemory()]

    def __str__(self):
        return "METAL_0"


def test_devices_without_host_memory_are_refused_naming_the_option():
    check_host_memory(jax.devices(), "Trainer(offload='optimizer')")  # XLA:CPU has it
    with pytest.raises(ValueError, match=r"Trainer\(offload='optimizer'\) keeps arrays in host memory \(memory "
                       r"kind 'pinned_host'\), which the metal device METAL_0 does not have \(its memories: "
                       r"\['device'\]\)"):
        check_host_memory([_NoHostMemory()], "Trainer(offload='optimizer')")


@pytest.mark.parametrize("strategy", ["single", "fsdp"])
@pytest.mark.parametrize("offload", ["optimizer", "optimizer+master"])
def test_losses_match_the_fit_without_offload_and_the_state_stays_on_the_host(strategy, offload):
    precision = "bf16-mixed" if offload == "optimizer+master" else "32-true"
    plain, plain_module, plain_losses = _fit(max_steps=4, strategy=strategy, precision=precision)
    trainer, module, losses = _fit(offload, max_steps=4, strategy=strategy, precision=precision)
    assert _kinds(plain.state.opt_state) == {"device"}
    assert _kinds(trainer.state.opt_state) == {HOST}
    assert _kinds(trainer.state.params) == ({HOST} if offload == "optimizer+master" else {"device"})
    assert _kinds(trainer.state.model_state) | _kinds(trainer.state.metrics) <= {"device"}
    assert losses == pytest.approx(plain_losses, rel=1e-6, abs=1e-6)
    assert_trees_close(trainer.state.opt_state, plain.state.opt_state, rtol=1e-6, atol=1e-6)
    assert_trees_close(module.variables, plain_module.variables, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("offload", ["optimizer", "optimizer+master"])
def test_an_interrupted_fit_resumes_exactly(tmp_path, offload):
    full, full_module, full_losses = _fit(offload, max_epochs=4)
    _, _, first = _fit(offload, max_epochs=2, enable_checkpointing=True, callbacks=[fj.ModelCheckpoint(tmp_path)])
    history = LossHistory()
    resumed = quiet_trainer(max_epochs=4, offload=offload, enable_checkpointing=True,
                            callbacks=[history, fj.ModelCheckpoint(tmp_path)])
    module = Tower()
    resumed.fit(module, _loader(), ckpt_path="last")
    assert first + history.losses == full_losses
    assert _kinds(resumed.state.opt_state) == {HOST}
    assert_trees_close(module.variables, full_module.variables, rtol=0, atol=0)
    assert_trees_close(resumed.state.opt_state, full.state.opt_state, rtol=0, atol=0)


class CallsTheModel(fj.Callback):
    def on_validation_epoch_end(self, trainer, module):
        self.outputs = module.model(DATA["x"][:4])  # a host call, on the train state's parameters


def test_validation_predict_and_host_calls_read_host_master_weights():
    called = CallsTheModel()
    trainer = quiet_trainer(max_steps=2, offload="optimizer+master", precision="bf16-mixed", limit_val_batches=1,
                            callbacks=[called])
    module = Tower()
    trainer.fit(module, _loader(), _loader())
    assert _kinds(trainer.state.params) == {HOST}
    assert "val/loss" in trainer.callback_metrics and called.outputs.shape == (4, 1)
    assert _kinds(module.variables) == {"device"}  # the module's own copy: usable by any jax.jit
    assert trainer.predict(module, _loader()).shape == (64, 1)


def test_combines_with_accumulation_several_steps_a_call_loss_scaling_and_ema():
    """The scans over micro-batches and steps carry the state in host memory; 16-mixed's skip and
    EMA's average read the fetched copies."""
    options = dict(max_epochs=2, accumulate_grad_batches=2, steps_per_execution=2, precision="16-mixed",
                   data=regression_data(n=256))
    runs = {}
    for offload in ("none", "optimizer+master"):
        trainer = quiet_trainer(offload=offload, callbacks=[fj.EMA(0.9, apply_to_module=True)],
                                **{k: v for k, v in options.items() if k != "data"})
        module = Tower()
        trainer.fit(module, fj.DataLoader(options["data"], batch_size=32, shuffle=True, seed=3))
        runs[offload] = (trainer, module)
    (plain, plain_module), (trainer, module) = runs["none"], runs["optimizer+master"]
    assert _kinds(trainer.state.opt_state) == {HOST}
    assert_trees_close(module.variables, plain_module.variables, rtol=1e-6, atol=1e-6)
    assert_trees_close(trainer.state.opt_state, plain.state.opt_state, rtol=1e-6, atol=1e-6)


def test_fj_plan_counts_the_offloaded_bytes_as_host_memory():
    plan = fj.plan(Tower(), _loader(), strategy="single", precision="bf16-mixed",
                   sweep={"offload": ["none", "optimizer", "optimizer+master"]})
    plain, optimizer, master = plan.candidates
    assert (optimizer.name, master.name) == ("as configured offload=optimizer", "as configured offload=optimizer+master")
    assert plain.memory["host"] == 0 and optimizer.memory["host"] == optimizer.memory["optimizer"] > 0
    assert master.memory["host"] == master.memory["params"] + master.memory["optimizer"]
    assert master.offload == "optimizer+master" and "(host)" in plan.render()
    # XLA:CPU counts its host memory kind as the device's: the plan takes it out of the peak
    assert master.memory["peak"] < plain.memory["peak"]
    with pytest.raises(ValueError, match=r"Trainer\(offload=...\) got 'disk'"):
        fj.plan(Tower(), _loader(), strategy="single", sweep={"offload": ["disk"]})


def test_the_model_summary_says_where_the_optimizer_state_lives(capsys):
    trainer = quiet_trainer(max_steps=1, offload="optimizer+master", enable_model_summary=True)
    trainer.fit(Tower(), _loader())
    out = capsys.readouterr().out
    assert "Trainable params (18.75 KiB, in host memory)" in out
    assert "Optimizer state (37.51 KiB, in host memory)" in out


def test_8bit_moments_travel_as_they_are():
    plain, _, plain_losses = _fit(moments="int8", max_steps=3)
    trainer, _, losses = _fit("optimizer", moments="int8", max_steps=3)
    codes = trainer.state.opt_state[0].mu["layers_2"]["kernel"]
    assert codes.dtype == jax.numpy.int8 and codes.sharding.memory_kind == HOST
    assert losses == pytest.approx(plain_losses, rel=1e-6, abs=1e-6)
    # the float32 moments of the small leaves differ in their last bit (another fusion of the update)
    assert_trees_close(trainer.state.opt_state, plain.state.opt_state, rtol=1e-5, atol=1e-7)


class Generates(fj.Callback):
    def on_train_end(self, trainer, module):  # the train state's parameters, kept in host memory
        self.tokens = trainer.generate(module, [[1, 2, 3]], max_new_tokens=3, temperature=0)


def test_generate_during_a_fit_reads_host_master_weights():
    generates = Generates()
    tokens = np.random.default_rng(0).integers(0, 32, size=(16, 9)).astype(np.int32)
    trainer = quiet_trainer(max_steps=1, offload="optimizer+master", strategy="single", callbacks=[generates])
    trainer.fit(TinyLMModule(), fj.DataLoader(tokens, batch_size=8))
    assert _kinds(trainer.state.params) == {HOST} and len(generates.tokens[0]) == 3
