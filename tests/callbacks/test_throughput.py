"""ThroughputMonitor logs Lightning 2.6's keys at Lightning's rows, with model FLOPs (a module's
`flops_per_batch`, else XLA's count without remat) and XLA's hardware FLOPs apart, syncing only at
log steps; `Trainer.train_step_flops` counts every micro-batch and step of a call.

How the expected keys and counts were produced: Lightning 2.6.6 in a scratch venv, a
`LightningModule` with one `nn.Linear(3, 1)` and `flops_per_batch = 100`, 40 samples in batches of
4, `Trainer(accelerator="cpu", max_steps=6, log_every_n_steps=2, val_check_interval=4,
num_sanity_val_steps=0, logger=CSVLogger(...))` and `ThroughputMonitor(batch_size_fn=lambda b:
b[0].shape[0], window_size=3)`, the CSV's `train/*` columns read per row:
- devices=1: step 1 {time, batches 2, samples 8}; steps 3 and 5 add device/batches_per_sec,
  device/samples_per_sec, device/flops_per_sec (batches 4 and 6, samples 16 and 24);
- devices=2, strategy="ddp" (two processes, 4 samples each): the same counts (rank 0's: one
  device's) and, at steps 3 and 5, also batches_per_sec, samples_per_sec, flops_per_sec;
- devices=1, accumulate_grad_batches=2, length_fn=lambda b: 5 * b[0].shape[0]: step 1 already
  has every rate (4 batches >= window 3) and lengths 80, device/items_per_sec; steps 3 and 5:
  batches 8 and 12, samples 32 and 48, lengths 160 and 240.
(Lightning also logs `validate/*` keys from its validation batches; fitjax logs training's.)
On a CPU Lightning knows no peak, so no `device/mfu`; here a `peak_flops=` adds it.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest
from helpers import Regressor, quiet_trainer, regression_data

import fitjax as fj
from fitjax.callbacks import throughput

COUNTS = ["train/batches", "train/samples", "train/time"]
# Lightning's keys, and fitjax's hardware FLOPs (XLA's count of the step as it runs)
DEVICE_RATES = ["train/device/batches_per_sec", "train/device/flops_per_sec", "train/device/samples_per_sec",
                "train/device/hardware_flops_per_sec"]
GLOBAL_RATES = ["train/batches_per_sec", "train/flops_per_sec", "train/samples_per_sec",
                "train/hardware_flops_per_sec"]


class Rows(fj.loggers.Logger):
    """The monitor's values of each `log_metrics` call that has some: (step, values)."""

    name, version = "rows", 0

    def __init__(self):
        self.rows = []

    def log_metrics(self, metrics, step):
        mine = {k: v for k, v in metrics.items() if k.startswith("train/") and "loss" not in k and "mae" not in k}
        if mine:
            self.rows.append((step, mine))

    def log_hyperparams(self, params):
        pass


def _data(per_device_batch, devices):
    # 10 batches an epoch, as Lightning's 40 samples in 4s
    data = regression_data(n=10 * per_device_batch * devices, d=3)
    return fj.DataLoader(data, batch_size=per_device_batch * devices)


def _fit(*, devices=1, strategy="single", accumulate=1, length=False, module=None, remat="none", **monitor_kwargs):
    rows = Rows()
    monitor = fj.ThroughputMonitor(batch_size_fn=lambda b: b["x"].shape[0],
                                   length_fn=(lambda b: 5 * b["x"].shape[0]) if length else None,
                                   window_size=3, **monitor_kwargs)
    trainer = quiet_trainer(max_steps=6, log_every_n_steps=2, val_check_interval=4, num_sanity_val_steps=0,
                            devices=devices, strategy=strategy, accumulate_grad_batches=accumulate, logger=rows,
                            callbacks=[monitor], remat=remat)
    data = _data(4, devices)
    trainer.fit(module or Regressor(batchnorm=False), data, data)
    return trainer, monitor, rows.rows


def _keys(rows):
    return [(step, sorted(values)) for step, values in rows]


def test_one_device_logs_lightnings_keys_and_counts_at_its_rows():
    trainer, monitor, rows = _fit()
    assert _keys(rows) == [(1, COUNTS), (3, sorted(COUNTS + DEVICE_RATES)), (5, sorted(COUNTS + DEVICE_RATES))]
    assert [(v["train/batches"], v["train/samples"]) for _, v in rows] == [(2, 8), (4, 16), (6, 24)]
    times = [v["train/time"] for _, v in rows]
    assert 0 < times[0] < times[1] < times[2]
    last = rows[-1][1]
    assert last["train/device/samples_per_sec"] == pytest.approx(4 * last["train/device/batches_per_sec"])
    flops = trainer.train_step_flops()
    assert last["train/device/flops_per_sec"] == pytest.approx(flops * last["train/device/batches_per_sec"])
    assert last["train/device/hardware_flops_per_sec"] == last["train/device/flops_per_sec"]  # no remat
    assert monitor.metrics == last


@pytest.mark.parametrize("strategy, devices", [("dp", 2), ("fsdp", 8)])
def test_several_devices_add_the_global_rates_and_count_one_devices_samples(strategy, devices):
    # Lightning's ddp with 2 processes of 4 samples each; fitjax's one process feeds the global
    # batch (4 a device), and the counts are one device's, as rank 0's are in Lightning
    trainer, _, rows = _fit(devices=devices, strategy=strategy)
    everything = sorted(COUNTS + DEVICE_RATES + GLOBAL_RATES)
    assert _keys(rows) == [(1, COUNTS), (3, everything), (5, everything)]
    assert [(v["train/batches"], v["train/samples"]) for _, v in rows] == [(2, 8), (4, 16), (6, 24)]
    last = rows[-1][1]
    for key in ("batches_per_sec", "samples_per_sec", "flops_per_sec", "hardware_flops_per_sec"):
        assert last[f"train/{key}"] == pytest.approx(devices * last[f"train/device/{key}"])


def test_accumulation_and_lengths_count_micro_batches_and_items_as_lightning():
    _, _, rows = _fit(accumulate=2, length=True)
    everything = sorted(COUNTS + DEVICE_RATES + ["train/device/items_per_sec", "train/lengths"])
    assert _keys(rows) == [(1, everything), (3, everything), (5, everything)]
    assert [(v["train/batches"], v["train/samples"], v["train/lengths"]) for _, v in rows] == [
        (4, 16, 80), (8, 32, 160), (12, 48, 240)]
    last = rows[-1][1]
    assert last["train/device/items_per_sec"] == pytest.approx(5 * last["train/device/samples_per_sec"])


def test_a_given_peak_adds_mfu_and_the_monitor_syncs_only_at_the_first_and_log_steps(monkeypatch):
    waits = []
    real = jax.block_until_ready
    monkeypatch.setattr(throughput.jax, "block_until_ready", lambda x: waits.append(1) or real(x))
    trainer, _, rows = _fit(peak_flops=1e9)
    # first call (step 1), log steps 2, 4, 6, and once before the validation at step 4: not per step
    assert len(waits) == 5
    last = rows[-1][1]
    assert last["train/device/mfu"] == pytest.approx(last["train/device/flops_per_sec"] / 1e9)
    assert last["train/device/hfu"] == pytest.approx(last["train/device/hardware_flops_per_sec"] / 1e9)


class Block(nn.Module):
    @nn.compact
    def __call__(self, x):
        return x + nn.Dense(x.shape[-1])(nn.gelu(nn.Dense(16)(x)))


class Tower(Regressor):
    """Three residual Linen blocks: layers `Trainer(remat=...)` recomputes."""

    def __init__(self):
        super().__init__(batchnorm=False)
        self.model = nn.Sequential([Block(), Block(), Block(), nn.Dense(1)])

    def loss(self, model, batch):
        pred = model(batch["x"])
        return ((pred - batch["y"]) ** 2).mean(), {"pred": pred}


def _per_batch(row, key):
    return row[f"train/device/{key}"] / row["train/device/batches_per_sec"]


def test_remat_raises_the_hardware_flops_but_not_the_model_flops_or_mfu():
    plain, _, plain_rows = _fit(module=Tower(), peak_flops=1e9)
    remat, _, remat_rows = _fit(module=Tower(), peak_flops=1e9, remat="full")
    model = plain.train_step_flops()
    # the same step without remat, counted as a program of its own: the fits count the programs
    # they ran, which also pick each batch from those kept on the devices (a few index FLOPs)
    assert remat.train_step_flops(remat="none") == pytest.approx(model, rel=1e-2)
    assert remat.train_step_flops() > model * 1.05  # the recomputed layers' forward passes
    row, plain_row = remat_rows[-1][1], plain_rows[-1][1]
    assert _per_batch(row, "flops_per_sec") == pytest.approx(model, rel=1e-2)
    assert _per_batch(row, "hardware_flops_per_sec") == pytest.approx(remat.train_step_flops())
    assert _per_batch(plain_row, "hardware_flops_per_sec") == pytest.approx(model)
    # MFU from the model's FLOPs: remat's extra work shows in the HFU only
    assert row["train/device/mfu"] == pytest.approx(row["train/device/flops_per_sec"] / 1e9)
    assert row["train/device/hfu"] / row["train/device/mfu"] == pytest.approx(remat.train_step_flops() / model,
                                                                              rel=1e-2)


def test_a_modules_flops_per_batch_is_the_model_count_as_in_lightning():
    module = Regressor(batchnorm=False)
    module.flops_per_batch = 100  # Lightning's attribute: one batch on one device
    # a declared shape too: the user's own count overrides the estimate (Lightning's override)
    module.transformer_shape = fj.TransformerShape(layers=1, width=3, context=1)
    trainer, _, rows = _fit(module=module, devices=2, strategy="dp")
    last = rows[-1][1]
    assert _per_batch(last, "flops_per_sec") == pytest.approx(100)
    # the planner reads the same order
    counted = fj.planner.model_flops(module, trainer.state.params, rows_per_step=8, batches_per_step=1, devices=2)
    assert (counted.source, counted.per_step) == ("flops_per_batch", 200)
    del module.flops_per_batch
    assert fj.planner.model_flops(module, trainer.state.params, rows_per_step=8, batches_per_step=1,
                                  devices=2).source == "6N+attention"
    assert last["train/flops_per_sec"] == pytest.approx(2 * last["train/device/flops_per_sec"])
    assert _per_batch(last, "hardware_flops_per_sec") == pytest.approx(trainer.train_step_flops())


def test_train_step_flops_counts_every_micro_batch_step_and_device():
    def flops(batch, **kwargs):
        trainer = quiet_trainer(max_steps=1, **kwargs)
        trainer.fit(Regressor(batchnorm=False), _data(batch, 1))
        return trainer.train_step_flops()

    one = flops(32, strategy="single", devices=1)
    # XLA counts a loop body once: without unrolling these would report one micro-batch's
    assert flops(16, strategy="single", devices=1, accumulate_grad_batches=2) == pytest.approx(one, rel=0.1)
    assert flops(32, strategy="single", devices=1, steps_per_execution=3) == pytest.approx(one, rel=0.05)
    # each device's share of the partitioned program
    assert flops(32, strategy="dp", devices=4) == pytest.approx(one / 4, rel=0.2)
    with pytest.raises(RuntimeError, match=r"known once Trainer.fit has built"):
        quiet_trainer().train_step_flops()


def test_the_peak_table_names_common_chips_and_nothing_else():
    assert throughput.peak_flops("NVIDIA H100 80GB HBM3", jnp.bfloat16) == 989.4e12
    assert throughput.peak_flops("NVIDIA H100 PCIe", jnp.bfloat16) == 756e12
    assert throughput.peak_flops("NVIDIA H200", jnp.float32) == 494.7e12  # TF32, XLA's default
    assert throughput.peak_flops("NVIDIA A100-SXM4-80GB", jnp.bfloat16) == 312e12
    assert throughput.peak_flops("NVIDIA L4", jnp.bfloat16) == 121e12
    assert throughput.peak_flops("NVIDIA L40S", jnp.bfloat16) is None
    assert throughput.peak_flops("TPU v4", jnp.bfloat16) == 275e12
    assert throughput.peak_flops("TPU v5 lite", jnp.float32) == 197e12
    assert throughput.peak_flops("TPU v5p", jnp.bfloat16) == 459e12
    assert throughput.peak_flops("TPU v6 lite", jnp.bfloat16) == 918e12
    assert throughput.peak_flops("cpu", jnp.float32) is None
    with jax.default_matmul_precision("highest"):
        assert throughput.peak_flops("NVIDIA A100-SXM4-40GB", jnp.float32) == 19.5e12


@pytest.mark.parametrize("kwargs, match", [
    (dict(batch_size_fn=3), r"batch_size_fn=\.\.\.\) must be a function"),
    (dict(batch_size_fn=len, window_size=1), r"window_size=\.\.\.\) must be an int of at least 2"),
    (dict(batch_size_fn=len, peak_flops=-1), r"peak_flops=\.\.\.\) must be a positive number"),
])
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises((TypeError, ValueError), match=match):
        fj.ThroughputMonitor(**kwargs)
