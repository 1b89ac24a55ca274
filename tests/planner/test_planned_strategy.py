"""`Trainer(strategy="plan")`: each fit runs the strategy the planner recommends for its devices.

On 8 CPU devices with a memory budget that dp and ZeRO-1 exceed (a replicated 1 MiB Dense with
Adam's moments), the planner picks fsdp, says why in one line, and the fit trains sharded.
"""

from __future__ import annotations

import flax.linen as nn
import numpy as np
import optax
import pytest
from helpers import quiet_trainer

import fitjax as fj
from fitjax.planner import PlannedStrategy
from fitjax.strategies import FSDP


class Wide(fj.LitModule):
    def __init__(self):
        super().__init__()
        self.model = nn.Sequential([nn.Dense(512), nn.Dense(1)])  # 1 MiB of float32 parameters

    def loss(self, model, batch):
        return ((model(batch["x"]) - batch["y"]) ** 2).mean()

    def configure_optimizer(self):
        return optax.adam(1e-3)


def data():
    rng = np.random.default_rng(0)
    return {"x": rng.normal(size=(32, 512)).astype(np.float32), "y": rng.normal(size=(32, 1)).astype(np.float32)}


def test_plan_picks_fsdp_where_dp_does_not_fit_and_says_why(capsys):
    # planned here: dp peaks at 5.0 MiB a device, zero1 at 3.3 MiB, fsdp at 2.4 MiB
    trainer = quiet_trainer(strategy=PlannedStrategy(memory_bytes=3 * 2**20, headroom=0.0), max_steps=2)
    trainer.fit(Wide(), fj.DataLoader(data(), batch_size=16))
    chose = [line for line in capsys.readouterr().out.splitlines() if "strategy 'plan' chose" in line]
    assert len(chose) == 1 and chose[0].startswith("fitjax: strategy 'plan' chose fsdp (")
    assert "dp, zero1 do not fit" in chose[0] and "in 3 MiB per device" in chose[0]
    assert isinstance(trainer.strategy, FSDP) and dict(trainer.strategy.mesh.shape)["fsdp"] == 8
    assert trainer.global_step == 2 and trainer.step_options.remat == "none"
    kernel = trainer.state.params["layers_0"]["kernel"]
    assert kernel.sharding.shard_shape(kernel.shape)[0] * 8 == kernel.shape[0] or \
        kernel.sharding.shard_shape(kernel.shape)[1] * 8 == kernel.shape[1]  # sharded over the 8 devices


def test_plan_is_the_string_and_its_budget_is_checked():
    assert isinstance(fj.Trainer(strategy="plan", logger=False)._planned, PlannedStrategy)
    with pytest.raises(ValueError, match=r"PlannedStrategy\(memory_bytes=...\) must be a positive int.*got -1"):
        PlannedStrategy(memory_bytes=-1)
    with pytest.raises(ValueError, match=r"Trainer\(strategy=...\) got 'plans'; use one of \['auto', 'plan'"):
        fj.Trainer(strategy="plans")


def test_plan_with_runs_is_refused_before_anything_compiles():
    # the planner compiles one run's step; runs=3 vmaps three states through it: no plan describes that
    with pytest.raises(ValueError, match=r"Trainer\(strategy='plan'\) with Trainer\(runs=3\) is not supported: "
                                         r"the planner plans one run's train step.*strategy='single', 'dp' or 'runs'"):
        fj.Trainer(strategy="plan", runs=3, logger=False)
    trainer = quiet_trainer(runs=2, max_steps=1)
    with pytest.raises(ValueError, match=r"Trainer.plan with Trainer\(runs=2\) is not supported"):
        trainer.plan(Wide(), fj.DataLoader(data(), batch_size=16))
