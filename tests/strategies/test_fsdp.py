"""FSDP on 8 CPU devices: the numbers of one device, with the state really split over devices."""

from __future__ import annotations

import flax.linen as nn
import jax
import numpy as np
import optax
import pytest
from flax import nnx
from helpers import LossHistory, Regressor, assert_trees_close, quiet_trainer, regression_data
from jax.sharding import PartitionSpec as P

import fitjax as fj
from fitjax.strategies import FSDP


def _fit(strategy, devices=8, module=None, steps_per_epoch_data=256):
    history = LossHistory()
    trainer = quiet_trainer(max_epochs=2, strategy=strategy, devices=devices, callbacks=[history],
                            log_every_n_steps=4)
    module = module or Regressor()
    trainer.fit(module, fj.DataLoader(regression_data(n=steps_per_epoch_data), batch_size=32, shuffle=True, seed=1),
                fj.DataLoader(regression_data(n=100, seed=1), batch_size=32))
    return trainer, module, history.losses


@pytest.fixture(scope="module")
def single_run():
    return _fit("single", devices=1)


@pytest.mark.parametrize("strategy", [FSDP(min_size_to_shard=0), FSDP(data=2, fsdp=4, min_size_to_shard=0)],
                         ids=["fsdp8", "hybrid2x4"])
def test_fsdp_matches_single_device_per_step_and_final_params(single_run, strategy):
    single, m1, losses1 = single_run
    trainer, m8, losses8 = _fit(strategy)
    np.testing.assert_allclose(losses8, losses1, rtol=1e-5, atol=1e-6)
    assert_trees_close(m8.variables, m1.variables, rtol=1e-5, atol=1e-6)
    assert trainer.callback_metrics["val/loss"] == pytest.approx(single.callback_metrics["val/loss"], rel=1e-5)

    fsdp = strategy.mesh.shape["fsdp"]
    kernel = trainer.state.params["Dense_0"]["kernel"]  # [8, 32]: the 32 columns split fsdp ways
    assert kernel.sharding.spec == P(None, "fsdp")
    assert {s.data.shape for s in kernel.addressable_shards} == {(8, 32 // fsdp)}
    momentum = trainer.state.opt_state[0].trace["Dense_0"]["kernel"]  # optimizer state follows
    assert momentum.sharding.spec == P(None, "fsdp")
    bias = trainer.state.params["Dense_0"]["bias"]  # rank 1: replicated
    assert bias.sharding.is_fully_replicated


def test_default_rule_shards_the_largest_dividing_dimension_and_spares_small_arrays():
    class Wide(nn.Module):
        @nn.compact
        def __call__(self, x, train=False):
            x = nn.Dense(256)(x)        # kernel [8, 256] = 2048 elements
            x = nn.Dense(200)(x)        # kernel [256, 200]: 256 divides by 8, 200 does too; 256 wins
            return nn.Dense(1)(x)       # kernel [200, 1]: 200 elements, under the threshold

    class Module(Regressor):
        def __init__(self):
            super().__init__(batchnorm=False)
            self.model = Wide()

    trainer = quiet_trainer(max_steps=1, strategy=FSDP(min_size_to_shard=1024), devices=8)
    trainer.fit(Module(), fj.DataLoader(regression_data(n=64), batch_size=32))
    rows = fj.strategies.describe_sharding(trainer.state.params)
    assert rows["Dense_0/kernel"].spec == P(None, "fsdp")
    assert rows["Dense_1/kernel"].spec == P("fsdp", None)
    assert rows["Dense_2/kernel"].spec == P()
    assert rows["Dense_1/kernel"].bytes_per_device == 256 * 200 * 4 // 8
    assert rows["Dense_2/kernel"].bytes_per_device == 200 * 4


class Annotated(nn.Module):
    @nn.compact
    def __call__(self, x, train=False):
        x = nn.Dense(64, kernel_init=nn.with_partitioning(nn.initializers.lecun_normal(), ("fsdp", None)))(x)
        x = nn.Dense(64, kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(), ("embed", "mlp")))(x)
        return nn.Dense(1)(x)


class AnnotatedRegressor(Regressor):
    def __init__(self):
        super().__init__(batchnorm=False)
        self.model = Annotated()

    def configure_optimizer(self):
        return optax.adam(1e-2)


def test_linen_annotations_and_rules_override_the_default_rule():
    data = regression_data(n=64)
    trainer = quiet_trainer(max_steps=2, strategy=FSDP(min_size_to_shard=0, rules={"embed": None, "mlp": "fsdp"}),
                            devices=8)
    module = AnnotatedRegressor()
    trainer.fit(module, fj.DataLoader(data, batch_size=32))
    params = trainer.state.params
    assert params["Dense_0"]["kernel"].sharding.spec == P("fsdp", None)  # default would pick the 64
    assert params["Dense_1"]["kernel"].sharding.spec == P(None, "fsdp")
    adam = trainer.state.opt_state[0]
    assert adam.mu["Dense_0"]["kernel"].sharding.spec == P("fsdp", None)
    assert adam.nu["Dense_1"]["kernel"].sharding.spec == P(None, "fsdp")
    # the arrays handed back to the module are plain (unboxed) and the same as on one device
    single = AnnotatedRegressor()
    quiet_trainer(max_steps=2, strategy="single").fit(single, fj.DataLoader(data, batch_size=32))
    assert_trees_close(module.variables, single.variables, rtol=1e-5, atol=1e-6)


def test_unknown_logical_name_gets_an_error_naming_it():
    trainer = quiet_trainer(max_steps=1, strategy="fsdp", devices=8)
    with pytest.raises(ValueError, match=r"'embed'.*rules"):
        trainer.fit(AnnotatedRegressor(), fj.DataLoader(regression_data(n=32), batch_size=32))


def test_nnx_sharding_metadata_is_honoured():
    class Net(nnx.Module):
        def __init__(self, rngs):
            init = nnx.with_partitioning(nnx.initializers.lecun_normal(), ("fsdp", None))
            self.a = nnx.Linear(8, 64, kernel_init=init, rngs=rngs)
            self.b = nnx.Linear(64, 1, rngs=rngs)

        def __call__(self, x, train=False):
            return self.b(self.a(x))

    class Module(Regressor):
        def __init__(self):
            super().__init__(batchnorm=False)
            with nnx.use_eager_sharding(False):  # placed by the strategy, not at construction
                self.model = Net(nnx.Rngs(0))

    trainer = quiet_trainer(max_steps=1, strategy=FSDP(min_size_to_shard=0), devices=8)
    trainer.fit(Module(), fj.DataLoader(regression_data(n=32), batch_size=32))
    assert trainer.state.params["a"]["kernel"].sharding.spec == P("fsdp", None)
    assert trainer.state.params["b"]["kernel"].sharding.spec == P("fsdp", None)  # default: [64, 1]


def test_string_name_uses_every_selected_device():
    trainer = quiet_trainer(strategy="fsdp", devices=4)
    assert dict(trainer.strategy.mesh.shape) == {"data": 1, "fsdp": 4, "tensor": 1}


@pytest.mark.parametrize("kwargs, devices, message", [
    ({"data": 3, "fsdp": 2}, 8, r"data=3, fsdp=2\) needs data × fsdp = 6 devices, but 8"),
    ({"fsdp": 3}, 8, r"fsdp=3\) does not divide the 8 devices"),
    ({"data": 0}, 8, r"data=...\) must be a positive int"),
])
def test_bad_mesh_errors_name_the_numbers(kwargs, devices, message):
    with pytest.raises(ValueError, match=message):
        quiet_trainer(strategy=FSDP(**kwargs), devices=devices)


def test_batch_that_does_not_divide_over_the_mesh_is_refused():
    trainer = quiet_trainer(max_steps=1, strategy=FSDP(data=2, fsdp=4))
    with pytest.raises(ValueError, match=r"batch size of 12, which does not divide over the 8 devices"):
        trainer.fit(Regressor(), fj.DataLoader(regression_data(n=48), batch_size=12))


def test_sharded_init_never_holds_the_whole_state_on_one_device():
    """The jitted init writes only each device's shards: its outputs and temporaries per device
    stay near 1/8 of the state (a replicated init would need the whole of it)."""
    import sys
    from pathlib import Path

    from fitjax import step as step_lib

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import memory as bench

    batch = {"x": np.ones((16, 256), np.float32), "y": np.ones((16, 1), np.float32)}
    used = {}
    for strategy, devices in [("single", 1), (FSDP(min_size_to_shard=0), 8)]:
        trainer = quiet_trainer(strategy=strategy, devices=devices)
        module = bench.Module(width=256, depth=2)
        state, compiled = step_lib.build(module.step_spec(), trainer.strategy, batch, seed=0)
        init = step_lib.forward.make_init_fn(module.step_spec(), optax.adam(1e-3), ("loss",))
        stats = jax.jit(init, out_shardings=compiled.state_shardings).lower(
            jax.random.key(0), trainer.strategy.shard_batch(batch), None).compile().memory_analysis()
        used[devices] = stats.output_size_in_bytes + stats.temp_size_in_bytes
        assert fj.strategies.bytes_per_device(state) == pytest.approx(stats.output_size_in_bytes, rel=0.01)
    assert used[8] < used[1] / 6
