"""`Trainer(runs=N, strategy="runs")`: the runs split over the 8 CPU devices, the batch whole on
each. Compared with the same runs on one device: to float tolerance, not bitwise (one run per
device is not computed as the batched product over all runs is; measured ~2e-6 apart)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from helpers import assert_trees_close, quiet_trainer
from test_many_runs import Decayed, loader

RUNS = [{"lr": 0.01 * (i + 1)} for i in range(8)]


def test_runs_split_over_devices_equal_the_runs_on_one():
    split = quiet_trainer(max_epochs=1, runs=RUNS, strategy="runs")
    split.fit(Decayed(), loader(), loader())
    kernel = split.state.params["Dense_0"]["kernel"]
    assert len(kernel.sharding.device_set) == 8 and kernel.sharding.spec[0] == "runs"  # a run per device
    assert kernel.addressable_shards[0].data.shape[0] == 1

    together = quiet_trainer(max_epochs=1, runs=RUNS, strategy="single")
    together.fit(Decayed(), loader(), loader())
    assert_trees_close(split.state.params, together.state.params, rtol=1e-5, atol=1e-6)
    assert_trees_close(split.state.model_state, together.state.model_state, rtol=1e-5, atol=1e-6)
    for key, value in together.callback_metrics.items():
        np.testing.assert_allclose(split.callback_metrics[key], value, rtol=1e-5, err_msg=key)


def test_runs_that_do_not_divide_over_the_devices_are_refused():
    with pytest.raises(ValueError, match=r"over 8 devices, but it has 3: use a number of runs that is a multiple of 8"):
        quiet_trainer(max_epochs=1, runs=3, strategy="runs").fit(Decayed(), loader())
    with pytest.raises(ValueError, match=r"over 8 devices, but this state holds one run.*use strategy='dp' or 'single'"):
        quiet_trainer(max_epochs=1, strategy="runs").fit(Decayed(), loader())
