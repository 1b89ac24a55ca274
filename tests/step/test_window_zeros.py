"""A log window's fresh accumulators: made on the devices by one cached program of no inputs
(`fitjax.step.jitted._zeros_program`), not placed from the host per window."""

from __future__ import annotations

import numpy as np
from helpers import Regressor, quiet_trainer, regression_data

import fitjax as fj
from fitjax.profilers._compile import CompileTimes
from fitjax.step import jitted


def _fit(root, data, strategy: str):
    with CompileTimes() as times:
        trainer = quiet_trainer(max_epochs=1, strategy=strategy, log_every_n_steps=2, default_root_dir=root)
        trainer.fit(Regressor(batchnorm=False), fj.DataLoader(data, batch_size=16))
    return trainer, times.take_each()


def test_windows_take_zeros_made_ahead_compiled_once_per_process(tmp_path):
    """20 log windows (every 2 of 40 steps) take their zeros 16 a dispatch; a second fit of the same
    metrics and layout compiles no zeros program, and its rows are the first fit's."""
    data = regression_data(n=16 * 40)
    first, _ = _fit(tmp_path, data, "single")
    hits = jitted._zeros_for.cache_info().hits
    second, compiled = _fit(tmp_path, data, "single")
    assert "zeros_ahead" not in compiled, compiled
    assert jitted._zeros_for.cache_info().hits > hits
    assert np.isfinite(second.callback_metrics["train/loss"])
    assert second.callback_metrics == first.callback_metrics
    assert all(float(np.asarray(acc).sum()) == 0.0 for acc in second.state.metrics.values())  # reset at the end


def test_replicated_zeros_over_eight_devices_log_the_single_device_rows(tmp_path):
    """With `strategy="dp"` (8 CPU devices) the zeros are laid out as the state's accumulators are."""
    data = regression_data(n=16 * 8)
    single, _ = _fit(tmp_path, data, "single")
    dp, _ = _fit(tmp_path, data, "dp")
    np.testing.assert_allclose(dp.callback_metrics["train/loss_epoch"], single.callback_metrics["train/loss_epoch"],
                               rtol=1e-5)
    for acc in dp.state.metrics.values():
        assert acc.sharding.is_fully_replicated and len(acc.sharding.device_set) == 8
