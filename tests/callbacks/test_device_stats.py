"""DeviceStatsMonitor logs memory stats with Lightning's key shape at log steps, reading no device array.

Lightning 2.6's keys are `DeviceStatsMonitor.<hook>/<stat>` (its `_prefix_metric_keys` with the
logger's "/" separator), logged from the train, validation and test batch hooks when the logger
connector would log. On the CPU backend JAX keeps no allocator stats, so these runs log the
host's (`cpu_rss_bytes`, ...); on a GPU the same keys carry `bytes_in_use`, `peak_bytes_in_use`
and `bytes_limit` (checked by the last test where a GPU is present).
"""

from __future__ import annotations

import csv
import doctest

import jax
import pytest
from helpers import Regressor, quiet_trainer, regression_data
from jax._src import array as jax_array
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import fitjax as fj
from fitjax.callbacks import device_stats

TRAIN_END = "DeviceStatsMonitor.on_train_batch_end/"


def _fit(tmp_path, callbacks, **kwargs):
    loggers = [fj.CSVLogger(tmp_path, name="csv"), fj.TensorBoardLogger(tmp_path, name="tb")]
    trainer = quiet_trainer(max_steps=4, strategy="single", log_every_n_steps=2, logger=loggers,
                            limit_val_batches=2, callbacks=callbacks, **kwargs)
    data = fj.DataLoader(regression_data(n=64), batch_size=16)
    trainer.fit(Regressor(), data, data)
    return trainer


def test_a_fit_logs_the_stats_to_csv_and_tensorboard_at_log_steps(tmp_path):
    _fit(tmp_path, [fj.DeviceStatsMonitor()])
    with (tmp_path / "csv" / "version_0" / "metrics.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    for hook in ("on_train_batch_start", "on_train_batch_end", "on_validation_batch_start",
                 "on_validation_batch_end"):
        logged = [r for r in rows if r.get(f"DeviceStatsMonitor.{hook}/cpu_rss_bytes")]
        assert logged, hook
        for row in logged:
            assert float(row[f"DeviceStatsMonitor.{hook}/cpu_rss_bytes"]) > 0
            assert float(row[f"DeviceStatsMonitor.{hook}/cpu_peak_rss_bytes"]) >= float(
                row[f"DeviceStatsMonitor.{hook}/cpu_rss_bytes"])
    # train hooks at the rows of log steps 2 and 4 (logged at step - 1, as the train values)
    assert sorted(int(r["step"]) for r in rows if r.get(TRAIN_END + "cpu_rss_bytes")) == [1, 3]

    events = EventAccumulator(str(tmp_path / "tb" / "version_0"), size_guidance={"scalars": 0})
    events.Reload()
    points = events.Scalars(TRAIN_END + "cpu_rss_bytes")
    assert [p.step for p in points] == [1, 3] and all(p.value > 0 for p in points)


def test_logging_the_stats_reads_no_device_array_and_cpu_stats_false_logs_none_on_cpu(tmp_path, monkeypatch):
    def host_reads(folder, callbacks):
        reads = []
        original = jax_array.ArrayImpl._value
        with monkeypatch.context() as patch:
            patch.setattr(jax_array.ArrayImpl, "_value", property(lambda self: reads.append(1) or original.fget(self)))
            _fit(folder, callbacks)
        return len(reads)

    # the same hooks run in both fits; only the first logs (cpu_stats=False: nothing on the CPU backend)
    logging = host_reads(tmp_path / "logging", [fj.DeviceStatsMonitor()])
    assert logging == host_reads(tmp_path / "silent", [fj.DeviceStatsMonitor(cpu_stats=False)])
    assert "DeviceStatsMonitor" in (tmp_path / "logging" / "csv" / "version_0" / "metrics.csv").read_text()
    assert "DeviceStatsMonitor" not in (tmp_path / "silent" / "csv" / "version_0" / "metrics.csv").read_text()


def test_bad_arguments_and_a_trainer_without_logger_are_errors():
    with pytest.raises(ValueError, match=r"cpu_stats=\.\.\.\) must be None, True or False, got 'yes'"):
        fj.DeviceStatsMonitor(cpu_stats="yes")
    trainer = quiet_trainer(max_steps=1, strategy="single", callbacks=[fj.DeviceStatsMonitor()])
    with pytest.raises(ValueError, match=r"has none \(loggers=\[\]\).*logger=fj.CSVLogger"):
        trainer.fit(Regressor(), fj.DataLoader(regression_data(n=16), batch_size=16))


def test_the_device_stats_are_the_allocator_s_where_the_backend_keeps_them():
    device = jax.devices()[0]
    stats = device_stats.device_stats(device)
    if device.platform == "cpu":
        assert stats == {}  # XLA's CPU client keeps no allocator stats
        return
    jax.device_put(jax.numpy.ones((1024, 1024)), device).block_until_ready()
    assert stats["bytes_limit"] > 0
    assert device_stats.device_stats(device)["peak_bytes_in_use"] >= 4 * 1024 * 1024


def test_docstring_example_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    results = doctest.testmod(device_stats)
    assert results.failed == 0 and results.attempted > 0
