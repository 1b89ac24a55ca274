"""The state's copy a save writes: made on the host at the save (CPU), or within the devices'
memory and brought to the host on the writer's thread while the loop goes on (accelerators with
room for it). Both write the same checkpoints, bitwise, though the steps after a save donate the
state's buffers; the room is judged from the runtime's own memory figures."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from helpers import Regressor, assert_trees_close, quiet_trainer, regression_data

import fitjax as fj
from fitjax import checkpoint
from fitjax.checkpoint import _writer

DATA = regression_data(n=64)  # 2 batches of 32 an epoch


class Kept(fj.Callback):
    """The parameters on the host after every step (what each checkpoint must hold)."""

    def __init__(self):
        self.params = {}

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.params[trainer.global_step] = jax.device_get(trainer.state.params)


def _fit(folder, *, on_device: bool, strategy: str) -> tuple[Kept, fj.Trainer]:
    kept = Kept()
    writer = checkpoint.writer()
    before, writer.copy_on_device = writer.copy_on_device, on_device
    try:
        trainer = quiet_trainer(max_epochs=3, strategy=strategy, enable_checkpointing=True, callbacks=[
            kept, fj.ModelCheckpoint(folder, every_n_train_steps=1, save_top_k=-1)])
        trainer.fit(Regressor(batchnorm=False), fj.DataLoader(DATA, batch_size=32))
    finally:
        writer.copy_on_device = before
    return kept, trainer


@pytest.mark.parametrize("strategy", ["single", "fsdp"])
def test_a_copy_on_the_device_writes_what_a_host_copy_writes(tmp_path, strategy):
    """Every step saves; the next step donates the state while the writer still holds its copy.
    Each checkpoint restores the parameters of its step, bitwise, and equals the checkpoint the
    host-copy path writes (fsdp: each device's shards copied where they are)."""
    kept, trainer = _fit(tmp_path / "device", on_device=True, strategy=strategy)
    _fit(tmp_path / "host", on_device=False, strategy=strategy)
    names = sorted(p.name for p in (tmp_path / "device").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "host").iterdir()) and len(names) == 6
    for name in names:
        step = int(name.rsplit("step=", 1)[1])
        device = checkpoint.restore_state(tmp_path / "device" / name, trainer.state)
        host = checkpoint.restore_state(tmp_path / "host" / name, trainer.state)
        assert_trees_close(device.params, kept.params[step], rtol=0, atol=0)
        assert_trees_close(device.params, host.params, rtol=0, atol=0)


# the counters a TPU v5e chip reported after GPT-2 small's fit (`benchmarks/results/tpu-v5e/plan-b5437c5.json`)
CHIP = {"bytes_in_use": 1671781376, "peak_bytes_in_use": 1679497728, "bytes_limit": 16909336064,
        "bytes_reserved": 5830983680, "peak_bytes_reserved": 5830983680}
STATE = 1_492_485_128  # that fit's parameters and optimizer state


def test_the_copy_is_made_on_the_device_only_where_it_has_room():
    """The chip's peak (arrays and the program's reserved temporaries, 7.0 GiB of 15.75) leaves
    room for GPT-2 small's state and for 5x it, not 6x with 10% of the memory kept free; not where a
    device reports no memory. On CPU the host copy is the copy: none is made on the device."""
    assert fj.strategies.peak_bytes(CHIP) == 7_510_481_408  # the plan's peak within 0.8%
    assert fj.strategies.peak_bytes(None) is None
    assert _writer._room_for_copy(STATE, [CHIP])
    assert _writer._room_for_copy(5 * STATE, [CHIP]) and not _writer._room_for_copy(6 * STATE, [CHIP])
    assert not _writer._room_for_copy(STATE, [CHIP, {**CHIP, "peak_bytes_reserved": 14 * 2**30}])
    assert not _writer._room_for_copy(STATE, [None])
    assert not fj.step.xla_cpu.saves_copy_on_device("cpu")
    assert fj.step.xla_cpu.saves_copy_on_device("tpu") and fj.step.xla_cpu.saves_copy_on_device("gpu")
    tree = {"w": jax.numpy.ones((4, 4))}
    assert not checkpoint.CheckpointWriter()._copies_on_device(tree)
    assert checkpoint.CheckpointWriter(copy_on_device=True)._copies_on_device(tree)
    copy = _writer._HostCopy({**tree, "n": np.int32(3)}, on_device=True)
    assert copy.on_device
    host, moved = copy.host()
    assert isinstance(host["w"], np.ndarray) and host["n"] == 3 and moved >= 0.0
    assert copy.host() == (host, 0.0)  # the later saves of the step find it moved: no second charge
