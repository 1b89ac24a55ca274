"""Hooks cost nothing unless overridden: an epoch-only callback adds no host read per step.

`jax.transfer_guard` cannot see a sync on the CPU backend (device memory is host memory), so the
test counts every read of a device array's value instead (`np.asarray`, `float`, `.item()` and
`jax.device_get` all go through `ArrayImpl._value`) and compares runs of 8 and 16 steps.
"""

from __future__ import annotations

import doctest
import importlib

import pytest
from helpers import LossHistory, Regressor, quiet_trainer, regression_data
from jax._src import array as jax_array

import fitjax as fj


class EpochEnds(fj.Callback):
    def __init__(self):
        self.seen = []

    def on_train_epoch_end(self, trainer, module):
        self.seen.append(trainer.callback_metrics["train/loss_epoch"])


def _host_reads(monkeypatch, callback, steps: int) -> int:
    reads = []
    original = jax_array.ArrayImpl._value

    def counted(self):
        reads.append(1)
        return original.fget(self)

    trainer = quiet_trainer(max_epochs=2, limit_train_batches=steps // 2, strategy="single",
                            log_every_n_steps=1000, callbacks=[callback])
    data = fj.DataLoader(regression_data(n=256), batch_size=16)
    with monkeypatch.context() as patch:
        patch.setattr(jax_array.ArrayImpl, "_value", property(counted))
        trainer.fit(Regressor(), data)
    assert trainer.global_step == steps
    return len(reads)


def test_an_epoch_only_callback_leaves_the_step_loop_free_of_host_reads(monkeypatch):
    epoch_ends = EpochEnds()
    assert not fj.callbacks.CallbackList([epoch_ends]).wants("on_train_batch_end")
    per_step = (_host_reads(monkeypatch, epoch_ends, 16) - _host_reads(monkeypatch, epoch_ends, 8)) / 8
    assert per_step == 0
    assert len(epoch_ends.seen) == 4  # two fits of two epochs


def test_the_count_sees_a_callback_that_reads_every_step(monkeypatch):
    per_step = (_host_reads(monkeypatch, LossHistory(), 16) - _host_reads(monkeypatch, LossHistory(), 8)) / 8
    assert per_step >= 1


def test_module_hooks_run_before_callback_hooks():
    order = []

    class Module(Regressor):
        def on_train_epoch_end(self):
            order.append("module")

    class Last(fj.Callback):
        def on_train_epoch_end(self, trainer, module):
            order.append("callback")

    quiet_trainer(max_steps=2, strategy="single", callbacks=[Last()]).fit(
        Module(), fj.DataLoader(regression_data(n=32), batch_size=16))
    assert order == ["module", "callback"]


@pytest.mark.parametrize("name", ["_base", "early_stopping", "lr_monitor", "progress", "summary"])
def test_docstring_examples_run(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # examples build Trainers whose default logger picks a folder here
    results = doctest.testmod(importlib.import_module(f"fitjax.callbacks.{name}"))
    assert results.failed == 0 and results.attempted > 0
