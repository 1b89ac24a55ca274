"""The checkpoint a Trainer adds by itself: Lightning's result (the last epoch's state under
Lightning's name) with its epoch-end saves spaced by their measured cost; a configured
`ModelCheckpoint` keeps its own schedule.

Lightning's default (`ModelCheckpoint()` added by `enable_checkpointing=True`) saves at every
epoch's end with `save_top_k=1` and no monitor, so after `max_epochs=E` fit the folder holds
one checkpoint, `epoch=<E-1>-step=<steps>` (Lightning's test_default_checkpoint_behavior).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from helpers import Regressor, assert_trees_close, quiet_trainer, regression_data

import fitjax as fj
from fitjax import checkpoint
from fitjax.callbacks import DefaultCheckpoint

DATA = regression_data(n=64)  # 2 batches of 32 an epoch


pytestmark = pytest.mark.usefixtures("compile_cache")  # tests/conftest.py


class Saves(fj.Callback):
    """Records the checkpoint folders on disk after each epoch's end (checkpoint callbacks run
    last, so their epoch-end save is written by then: the default one waits for its saves)."""

    def __init__(self, folder: Path):
        self.folder, self.after_epoch = folder, []

    def on_train_epoch_start(self, trainer, module):
        if trainer.current_epoch:
            self.after_epoch.append(sorted(p.name for p in self.folder.glob("epoch=*")))


def _fit(tmp_path, *, epochs=6, callbacks=(), share=None, module=None):
    trainer = quiet_trainer(max_epochs=epochs, enable_checkpointing=True, default_root_dir=tmp_path,
                            callbacks=list(callbacks))
    if share is not None:  # the default checkpoint with another budget, as the Trainer adds it
        default = trainer.checkpoint_callback
        assert type(default) is DefaultCheckpoint
        default.share = share
    trainer.fit(module or Regressor(batchnorm=False), fj.DataLoader(DATA, batch_size=32))
    return trainer


def _folders(tmp_path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "checkpoints").iterdir())


def test_the_default_checkpoint_is_lightnings_result_with_fewer_saves(tmp_path):
    """With a budget no save fits in, only the first epoch's end (which measures a save) is
    saved during training; the end of training still leaves exactly Lightning's checkpoint: the
    last epoch's state, named `epoch=5-step=12`, and it restores to the trained state."""
    saves = Saves(tmp_path / "checkpoints")
    trainer = _fit(tmp_path, callbacks=[saves], share=1e-9)
    default = trainer.checkpoint_callback
    assert saves.after_epoch == [["epoch=0-step=2"]] * 5  # epochs 1..4 skipped: epoch 0 stays
    assert default.skipped_saves == 5
    assert _folders(tmp_path) == ["epoch=5-step=12"]
    assert default.last_model_path == default.best_model_path == str(tmp_path / "checkpoints/epoch=5-step=12")
    restored = checkpoint.restore_state(default.last_model_path, trainer.state)
    assert_trees_close(restored.params, trainer.state.params, rtol=0, atol=0)
    assert int(restored.step) == 12


class SlowSteps(fj.Callback):
    """Makes each step take `seconds` of host time, so training outlasts a save."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        time.sleep(self.seconds)


def test_with_the_whole_time_as_budget_every_epoch_end_saves(tmp_path):
    """`share=1`: every epoch end saves and replaces the previous one, as Lightning's default,
    once training takes longer than a save (share=1 lets saving take half the wall time: the
    saves' own time counts in the elapsed time). Tiny steps are slowed so that this holds on a
    loaded machine too, where one save can outlast two 1 ms steps."""
    saves = Saves(tmp_path / "checkpoints")
    trainer = _fit(tmp_path, callbacks=[saves, SlowSteps(0.3)], share=1.0)
    assert saves.after_epoch == [[f"epoch={e}-step={2 * (e + 1)}"] for e in range(5)]
    assert trainer.checkpoint_callback.skipped_saves == 0
    assert _folders(tmp_path) == ["epoch=5-step=12"]
    assert trainer.checkpoint_callback.save_seconds > 0
    assert trainer.checkpoint_callback.write_wait_seconds > 0  # on CPU each write is waited for
    assert trainer.checkpoint_callback.write_cpu_seconds == 0  # ...so its CPU time is in the wait


class FailsAt(fj.Callback):
    def __init__(self, step):
        self.step = step

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            raise RuntimeError("boom")


def test_an_exception_after_a_skipped_epoch_end_saves_where_fit_stopped(tmp_path):
    """Epoch ends 1.. are skipped, fit fails at step 7 (epoch 3): the state at step 7 is saved,
    and a resumed fit from it ends with the same parameters as an uninterrupted one."""
    with pytest.raises(RuntimeError, match="boom"):
        _fit(tmp_path, callbacks=[FailsAt(7)], share=1e-9)
    assert _folders(tmp_path) == ["epoch=3-step=7"]
    resumed = quiet_trainer(max_epochs=6, enable_checkpointing=True, default_root_dir=tmp_path)
    resumed.fit(Regressor(batchnorm=False), fj.DataLoader(DATA, batch_size=32), ckpt_path="last")
    straight = _fit(tmp_path / "straight")
    assert_trees_close(resumed.state.params, straight.state.params, rtol=0, atol=0)


def test_a_configured_model_checkpoint_keeps_its_schedule(tmp_path):
    """`ModelCheckpoint(save_top_k=-1)`: one save per epoch end, none skipped, whatever they cost."""
    ckpt = fj.ModelCheckpoint(tmp_path / "mine", save_top_k=-1)
    trainer = _fit(tmp_path, callbacks=[ckpt])
    assert trainer.checkpoint_callbacks == [ckpt]
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == [
        f"epoch={e}-step={2 * (e + 1)}" for e in range(6)]


class WriterSeen(fj.Callback):
    """Whether a checkpoint was still being written at each epoch's end, just before the default
    checkpoint (checkpoint callbacks run last) decides whether to save."""

    def __init__(self):
        self.busy = []

    def on_train_epoch_end(self, trainer, module):
        self.busy.append(checkpoint.writer().busy())


def test_on_an_accelerator_the_loop_goes_on_while_the_state_is_written(tmp_path):
    """Where the step does not run on the host's cores (`wait_for_writes=False`, an accelerator's
    default), a save costs the loop only the copy to host memory: nothing waits for the write,
    an epoch end reached while the previous save is being written is skipped, and the end of
    training still leaves Lightning's checkpoint, fully written."""
    assert fj.step.xla_cpu.saves_compete_with_the_step("cpu")
    assert not fj.step.xla_cpu.saves_compete_with_the_step("tpu")
    assert not fj.step.xla_cpu.saves_compete_with_the_step("gpu")
    seen = WriterSeen()
    trainer = quiet_trainer(max_epochs=6, enable_checkpointing=True, default_root_dir=tmp_path, callbacks=[seen])
    default = trainer.checkpoint_callback
    default.share, default.wait_for_writes = 1.0, False
    trainer.fit(Regressor(batchnorm=False), fj.DataLoader(DATA, batch_size=32))
    assert default.write_wait_seconds == 0.0
    # an Orbax write (~10 ms or more) outlasts an epoch of two tiny steps: the next end finds it busy
    # (a skip only where the writer was seen busy: it may finish between that look and the save's)
    assert 1 <= default.skipped_saves <= sum(seen.busy[1:])
    assert _folders(tmp_path) == ["epoch=5-step=12"]
    restored = checkpoint.restore_state(default.last_model_path, trainer.state)
    assert_trees_close(restored.params, trainer.state.params, rtol=0, atol=0)


def test_a_write_beside_the_loop_is_charged_its_cpu_time(tmp_path):
    """A loop bound by the host loses about the CPU time a write beside it takes (its Python
    holds the GIL), so the budget counts it: each finished write's CPU time, read from the
    writer's thread at the next epoch end that finds it done. Epochs of 1 s outlast a write (a
    write still going on a loaded machine only skips that epoch end); the last write, finished
    after the last epoch end looked, is charged when fit ends, so the figures hold every write."""
    trainer = quiet_trainer(max_epochs=3, enable_checkpointing=True, default_root_dir=tmp_path,
                            callbacks=[SlowSteps(0.5)])
    default = trainer.checkpoint_callback
    default.share, default.wait_for_writes = 1.0, False
    before = checkpoint.writer().write_cpu_seconds
    trainer.fit(Regressor(batchnorm=False), fj.DataLoader(DATA, batch_size=32))
    assert default.write_wait_seconds == 0.0
    assert 0 < default.write_cpu_seconds == pytest.approx(checkpoint.writer().write_cpu_seconds - before, abs=1e-9)
    assert _folders(tmp_path) == ["epoch=2-step=6"]


def test_a_copy_made_on_the_device_is_charged_its_transfer_to_the_host(tmp_path, monkeypatch):
    """Where the state is copied within the devices' memory, the writer's thread moves the copy
    to the host, and a TPU's steps slow down while it lasts (GPT-2 small's copy cost the steps
    beside it ~0.2 s on a v5e chip), so the budget charges that transfer's time, as the writer measured it,
    beside the write's CPU time. Here the copy is made on the (CPU) device by the writer's own
    switch; when fit returns, the default checkpoint has charged every second of both that the
    writer counted for this fit's saves."""
    writer = checkpoint.writer()
    monkeypatch.setattr(writer, "copy_on_device", True)
    trainer = quiet_trainer(max_epochs=3, enable_checkpointing=True, default_root_dir=tmp_path,
                            callbacks=[SlowSteps(0.5)])
    default = trainer.checkpoint_callback
    default.share, default.wait_for_writes = 1.0, False
    cpu, moved = writer.write_cpu_seconds, writer.transfer_seconds
    trainer.fit(Regressor(batchnorm=False), fj.DataLoader(DATA, batch_size=32))
    assert default.write_cpu_seconds == pytest.approx(writer.write_cpu_seconds - cpu, abs=1e-9)
    assert default.transfer_seconds == pytest.approx(writer.transfer_seconds - moved, abs=1e-9)
    assert default.transfer_seconds >= 0.0
    assert _folders(tmp_path) == ["epoch=2-step=6"]


def test_share_is_checked():
    with pytest.raises(ValueError, match=r"DefaultCheckpoint\(share=...\) must be a number in \(0, 1\], got 0"):
        DefaultCheckpoint(share=0)
    assert np.isclose(DefaultCheckpoint().share, 0.02)
