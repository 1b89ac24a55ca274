"""An in-memory `fj.DataLoader` kept on the devices: the same batches and numbers as host batches."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from helpers import (HostBatches, LossHistory, Regressor, assert_trees_close, count_compiles, quiet_trainer,
                     regression_data)

import fitjax as fj

# the same small programs, fit after fit: compiled once (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("compile_cache")


class SeenBatches(fj.Callback):
    def __init__(self):
        self.xs = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        stacked = batch[0] if isinstance(batch, tuple) else batch  # accumulation: (micro-batches, mask)
        self.xs.append(np.asarray(stacked["x"]))


def _fit(data, *, strategy="single", **trainer_kwargs):
    seen = SeenBatches()
    trainer = quiet_trainer(strategy=strategy, callbacks=[seen], **trainer_kwargs)
    module = Regressor()
    with count_compiles() as compiles:
        trainer.fit(module, data)
    return module.variables, seen.xs, compiles, trainer


@pytest.mark.parametrize("n, strategy", [(256, "single"), (100, "single"), (256, "dp")])
def test_same_batches_and_parameters_as_host_batches(n, strategy):
    """100 rows in batches of 32: three full batches from the device blocks and a short last one
    from the host. dp splits each block's batches over 8 devices."""
    data = regression_data(n=n)

    def loader():
        return fj.DataLoader(data, batch_size=32, shuffle=True, seed=3)

    on_device, xs_device, compiles, _ = _fit(loader(), strategy=strategy, max_epochs=3)
    on_host, xs_host, _, _ = _fit(HostBatches(loader()), strategy=strategy, max_epochs=3)
    assert compiles["gather"] == 1  # the blocks were gathered on device
    assert compiles["train_step"] == (1 if n % 32 == 0 else 2)  # + the short last batch's shape
    assert len(xs_device) == len(xs_host) == 3 * len(loader())
    for a, b in zip(xs_device, xs_host):  # hooks see each host batch, in the loader's order
        np.testing.assert_array_equal(a, b)
    assert_trees_close(on_device, on_host, rtol=0, atol=0)


@pytest.mark.parametrize("accumulate", [1, 2])
def test_several_blocks_per_epoch(monkeypatch, accumulate):
    """3 batches a block (2 with accumulate 2: whole calls): 7 batches in 3 blocks, padded, or in
    4 blocks of calls, the last holding the epoch's last group (1 batch of 2) alone."""
    from fitjax.data import _device_blocks as _resident

    data = regression_data(n=320)
    monkeypatch.setattr(_resident, "BLOCK_BYTES", 3 * 32 * 9 * 4)
    kwargs = dict(max_epochs=2, limit_train_batches=7, accumulate_grad_batches=accumulate)
    on_device, _, compiles, trainer = _fit(fj.DataLoader(data, batch_size=32, shuffle=True), **kwargs)
    on_host, _, _, _ = _fit(HostBatches(fj.DataLoader(data, batch_size=32, shuffle=True)), **kwargs)
    assert trainer.global_step == 2 * -(-7 // accumulate)
    assert compiles["train_step"] == 1 and compiles["gather"] == 1  # one block shape, one step
    assert_trees_close(on_device, on_host, rtol=0, atol=0)


class Recorded(fj.Callback):
    """Each step's loss, predictions (what `loss` returned, per real micro-batch), batch (the
    stacked micro-batches and their mask) and batch index."""

    def __init__(self):
        self.losses, self.preds, self.batches, self.indices = [], [], [], []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.losses.append(float(outputs["loss"]))
        self.preds.append(np.asarray(outputs["pred"]))
        self.batches.append([np.asarray(leaf) for leaf in jax.tree.leaves(batch)])
        self.indices.append(batch_idx)


def _fit_recorded(loader, **trainer_kwargs):
    recorded = Recorded()
    trainer = quiet_trainer(callbacks=[recorded], accumulate_grad_batches=2, **trainer_kwargs)
    module = Regressor()
    with count_compiles() as compiles:
        trainer.fit(module, loader)
    return jax.device_get(module.variables), recorded, compiles, trainer


@pytest.mark.parametrize("n, strategy", [(176, "single"), (160, "dp")])
def test_an_epochs_last_accumulation_group_runs_in_the_block_step(n, strategy):
    """5 batches of 32 with accumulate_grad_batches=2: 2 full groups, then a last group of 1 batch
    of 2 (Lightning steps after it, its loss divided by 2 all the same). On the devices that
    group is one more call of the block step: one train step compiled per fit, not a second for
    that group (~40 s for GPT-2 small on a TPU chip), and the host path's numbers bit for bit.
    176 rows add a short last batch of 16: another shape, its own step from the host."""
    data = regression_data(n=n)

    def loader():
        return fj.DataLoader(data, batch_size=32, shuffle=True, seed=3)

    kwargs = dict(strategy=strategy, max_epochs=2, log_every_n_steps=1)
    # the host fit first: under dp it compiles the slice keeping the last group's real
    # predictions (a "gather" too), which the device fit then finds compiled
    on_host, host, _, host_trainer = _fit_recorded(HostBatches(loader()), **kwargs)
    on_device, device, compiles, trainer = _fit_recorded(loader(), **kwargs)
    assert compiles["gather"] == 1  # the blocks were gathered on device
    assert compiles["train_step"] == (1 if n % 32 == 0 else 2)  # + the short last batch's shape
    assert trainer.global_step == host_trainer.global_step == 2 * (3 if n % 32 == 0 else 4)
    assert device.indices == host.indices
    for a, b in zip(device.batches, host.batches, strict=True):  # the same micro-batches and mask
        assert len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))
    assert device.losses == host.losses
    for a, b in zip(device.preds, host.preds, strict=True):
        np.testing.assert_array_equal(a, b)
    assert device.preds[2].shape == (1, 32, 1)  # the last group: its one real micro-batch's
    assert_trees_close(on_device, on_host, rtol=0, atol=0)
    assert trainer.callback_metrics == host_trainer.callback_metrics


def test_a_fit_resumed_before_an_epochs_last_group_keeps_one_block_shape(tmp_path):
    """Stopped after 4 optimizer steps (the second epoch's first) and resumed from its checkpoint:
    the resumed stretch (batches 2-4 of an epoch of 5) gathers blocks the epoch's size, so the
    resumed fit compiles its one block step, and ends as the uninterrupted fit did."""
    data = regression_data(n=160)

    def loader():
        return fj.DataLoader(data, batch_size=32, shuffle=True, seed=3)

    whole, recorded, _, _ = _fit_recorded(loader(), max_epochs=2)
    checkpoint = dict(enable_checkpointing=True, callbacks=[fj.ModelCheckpoint(dirpath=tmp_path, save_last=True)])
    quiet_trainer(max_steps=4, accumulate_grad_batches=2, **checkpoint).fit(Regressor(), loader())
    resumed = Regressor()
    history = LossHistory()
    trainer = quiet_trainer(max_epochs=2, accumulate_grad_batches=2, enable_checkpointing=True,
                            callbacks=[history, fj.ModelCheckpoint(dirpath=tmp_path, save_last=True)])
    with count_compiles() as compiles:
        trainer.fit(resumed, loader(), ckpt_path="last")
    assert compiles["train_step"] == 1 and compiles["gather"] == 1
    assert trainer.global_step == 6 and history.losses == recorded.losses[4:]
    assert_trees_close(jax.device_get(resumed.variables), whole, rtol=0, atol=0)


def test_a_loader_subclass_that_changes_batches_keeps_its_batches():
    class Augmented(fj.DataLoader):
        def __iter__(self):
            for batch in super().__iter__():
                yield {**batch, "x": batch["x"] + 1.0}

    data = regression_data(n=64)
    _, xs, compiles, _ = _fit(Augmented(data, batch_size=32), max_epochs=1)
    np.testing.assert_array_equal(np.concatenate(xs), data["x"] + 1.0)
    assert compiles["gather"] == 0  # host batches: the subclass's own


def test_data_too_large_for_the_devices_stays_on_the_host(monkeypatch):
    from fitjax.data import _device_blocks as _resident

    monkeypatch.setattr(_resident, "MAX_BYTES", 1000)
    _, xs, compiles, _ = _fit(fj.DataLoader(regression_data(n=64), batch_size=32), max_epochs=1)
    assert compiles["gather"] == 0 and len(xs) == 2


def test_a_large_step_on_cpu_takes_host_batches(monkeypatch):
    """On CPU a step over `CPU_STEP_FLOPS` (6 * parameters * batch) hides the host's per-batch work."""
    from fitjax.data import _device_blocks as _resident

    data = regression_data(n=64)
    parameters = 8 * 32 + 32 + 2 * 32 + 32 + 1  # Regressor: Dense(8->32), BatchNorm(32), Dense(32->1)
    monkeypatch.setattr(_resident, "CPU_STEP_FLOPS", 6 * parameters * 32)  # the limit: kept on device
    _, _, compiles, _ = _fit(fj.DataLoader(data, batch_size=32), max_epochs=1)
    assert compiles["gather"] == 1
    monkeypatch.setattr(_resident, "CPU_STEP_FLOPS", 6 * parameters * 32 - 1)
    _, xs, compiles, _ = _fit(fj.DataLoader(data, batch_size=32), max_epochs=1)
    assert compiles["gather"] == 0 and len(xs) == 2


@pytest.mark.parametrize("shuffle, gathered_at_epoch_ends", [(True, [2, 3, 4]), (False, [1, 1, 1])])
def test_the_next_epochs_block_is_gathered_before_the_epoch_ends(monkeypatch, shuffle, gathered_at_epoch_ends):
    """Once an epoch's calls are dispatched, the next epoch's first block is gathered, before the
    loop waits for the epoch's means (the device gathers while the host ends the epoch); without
    a shuffle the next epoch's block is this one. The numbers stay those of host batches."""
    from fitjax.data import _device_blocks

    gathered = []
    gather_rows = _device_blocks.Feed._gather_rows

    def counting(self, rows, k):
        gathered.append(len(rows))
        return gather_rows(self, rows, k)

    monkeypatch.setattr(_device_blocks.Feed, "_gather_rows", counting)
    at_epoch_end = []

    class AtEpochEnd(fj.Callback):
        def on_train_epoch_end(self, trainer, module):
            at_epoch_end.append(len(gathered))

    data = regression_data(n=256)
    module = Regressor()
    quiet_trainer(max_epochs=3, callbacks=[AtEpochEnd()]).fit(
        module, fj.DataLoader(data, batch_size=32, shuffle=shuffle, seed=3))
    assert at_epoch_end == gathered_at_epoch_ends
    host = Regressor()
    quiet_trainer(max_epochs=3).fit(host, HostBatches(fj.DataLoader(data, batch_size=32, shuffle=shuffle, seed=3)))
    assert_trees_close(module.variables, host.variables, rtol=0, atol=0)
