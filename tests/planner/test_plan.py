"""`Trainer.plan` / `fj.plan`: the train step fit would run, compiled for a target and measured.

On this machine's 8 CPU devices the plan's state bytes are checked against what a real fit holds;
TPU slices compile deviceless with libtpu (installed here), and their numbers must not change from
one run to the next.
"""

from __future__ import annotations

import collections
import gc
import json

import flax.linen as nn
import jax
import numpy as np
import optax
import pytest
from helpers import quiet_trainer  # first: it puts examples/ on the path

import digits  # noqa: E402,I001
import gpt  # noqa: E402

import fitjax as fj
from fitjax import planner

TINY_GPT = dict(layers=1, width=32, heads=2, context=32)


def gpt_data(batch_size=16):
    train, _ = gpt.splits(TINY_GPT["context"])
    return fj.DataLoader({"tokens": train["tokens"][:256]}, batch_size=batch_size)


def digits_data(batch_size=32):
    train, _ = digits.digits_splits()
    return fj.DataLoader({k: v[:256] for k, v in train.items()}, batch_size=batch_size)


def live_bytes_on(device) -> int:
    """Bytes of every live array's shard on `device`."""
    total = 0
    for array in jax.live_arrays():
        for shard in array.addressable_shards:
            if shard.device == device:
                total += shard.data.nbytes
    return total


@pytest.fixture(scope="module")
def digits_plans():
    """The digits CNN planned with dp, ZeRO-1 and fsdp on the 8 CPU devices (one sweep)."""
    module = digits.DigitsClassifier(total_steps=10)
    plan = quiet_trainer(strategy="fsdp").plan(module, digits_data(), sweep={"strategy": ["dp", "zero1", "fsdp"]})
    return {m.name: m for m in plan.candidates}


def test_planned_state_bytes_match_what_a_real_fit_holds_after_its_first_step(digits_plans):
    module, data = digits.DigitsClassifier(total_steps=10), digits_data()
    trainer = quiet_trainer(strategy="fsdp", max_steps=1, limit_val_batches=0)
    measured = digits_plans["fsdp"]
    planned = measured.memory["params"] + measured.memory["optimizer"] + measured.memory["other_state"]
    gc.collect()  # arrays an earlier test left for the collector would be freed during the fit
    before = live_bytes_on(trainer.devices[0])
    trainer.fit(module, data)
    gc.collect()
    held = live_bytes_on(trainer.devices[0]) - before  # the state fit keeps (and its module's copy)
    state = sum(s.data.nbytes for x in jax.tree.leaves(trainer.state) for s in x.addressable_shards
                if s.device == trainer.devices[0])
    assert planned == pytest.approx(state, rel=0.01)  # the same arrays, the same layout
    assert state <= held  # everything the plan counts is really there after the step
    assert measured.memory["peak"] >= planned + measured.memory["batch"]


def test_fsdp_keeps_an_eighth_of_the_state_and_zero1_of_the_optimizer_state_on_each_device(digits_plans):
    dp, zero1, fsdp = digits_plans["dp"], digits_plans["zero1"], digits_plans["fsdp"]
    assert zero1.zero1 and zero1.memory["params"] == dp.memory["params"]
    assert zero1.memory["optimizer"] == pytest.approx(dp.memory["optimizer"] / 8, rel=0.25)
    # the conv kernels and biases (under FSDP's min_size_to_shard) stay whole: ~1/8 overall
    assert fsdp.memory["params"] == pytest.approx(dp.memory["params"] / 8, rel=0.25)
    assert fsdp.memory["optimizer"] == pytest.approx(dp.memory["optimizer"] / 8, rel=0.25)
    assert "all-reduce" in dp.collectives and "all-gather" in fsdp.collectives
    assert dp.model_flops_source == "xla" and dp.model_flops == dp.xla_flops  # the CNN declares no shape


def test_an_fsdp_x_tensor_candidate_is_planned_where_the_rules_name_a_tensor_axis_and_fits_as_planned():
    from fitjax.planner._sweep import strategy_variants

    names = list(strategy_variants(fj.strategies.FSDP(rules=gpt.GPT_RULES), jax.devices()))
    assert names == ["dp", "zero1", "fsdp", "fsdp(data=2,fsdp=4)", "fsdp(fsdp=4,tensor=2)"]
    assert "fsdp(fsdp=4,tensor=2)" not in strategy_variants(fj.strategies.FSDP(), jax.devices())
    # a module's own rules (`logical_axis_rules`: the GPT example's, every fitjax.models module's) count too
    assert "fsdp(fsdp=4,tensor=2)" in strategy_variants(fj.strategies.DataParallel(), jax.devices(),
                                                         gpt.GPTModule.logical_axis_rules)

    module, data = gpt.GPTModule(**TINY_GPT), gpt_data()
    plan = quiet_trainer(strategy="fsdp").plan(
        module, data, sweep={"strategy": ["fsdp(fsdp=4,tensor=2)"]})
    (tensor,) = plan.candidates
    assert tensor.mesh == {"data": 1, "fsdp": 4, "tensor": 2}
    assert "all-reduce" in tensor.collectives  # the row-split matmuls' partial sums
    # the fit with that strategy holds the state the candidate planned, in the same layout
    trainer = quiet_trainer(strategy=fj.strategies.FSDP(tensor=2), max_steps=1,
                            limit_val_batches=0)
    trainer.fit(gpt.GPTModule(**TINY_GPT), data)
    state = sum(s.data.nbytes for x in jax.tree.leaves(trainer.state) for s in x.addressable_shards
                if s.device == trainer.devices[0])
    planned = tensor.memory["params"] + tensor.memory["optimizer"] + tensor.memory["other_state"]
    assert planned == pytest.approx(state, rel=0.01)
    up = trainer.state.params["h_0"]["mlp"]["c_fc"]["kernel"]
    assert up.addressable_shards[0].data.shape == (32 // 4, 128 // 2)


def test_gpt_example_planned_for_tpu_slices_declares_its_shape_and_is_deterministic():
    module = gpt.GPTModule(**TINY_GPT)
    kwargs = dict(strategy=fj.strategies.FSDP(rules=gpt.GPT_RULES), precision="bf16-mixed")
    first = fj.plan(module, gpt_data(), target="tpu-v5e-16", **kwargs)
    again = fj.plan(module, gpt_data(), target="tpu-v5e-16", **kwargs)
    v6e = fj.plan(module, gpt_data(), target="tpu-v6e-8", **kwargs)
    assert (first.devices, first.device_kind, v6e.devices) == (16, "TPU v5 lite", 8)
    drop_time = lambda plan: [{k: v for k, v in m.items() if k != "compile_s"} for m in plan.as_dict()["candidates"]]  # noqa: E731
    assert drop_time(first) == drop_time(again)
    m = first.candidates[0]
    assert m.fits and m.memory_limit == fj.planner.KINDS["tpu-v5e"].memory_bytes and m.step_time_s > 0 and 0 < m.mfu < 1
    assert m.model_flops_source == "6N+attention"
    n = sum(np.prod(p.shape) for p in jax.tree.leaves(jax.eval_shape(lambda: module.model.init(
        jax.random.key(0), np.zeros((1, 32), np.int32)))["params"]))
    tokens = 16 * TINY_GPT["context"]
    assert m.model_flops == pytest.approx((6 * n + 12 * 32 * 32) * tokens / 16)
    assert json.loads(first.to_json())["recommended"] == "as configured"
    # the estimate runs the work at the share of the peak measured on a v5e chip, never faster
    spec = fj.planner.KINDS["tpu-v5e"]
    assert m.step_time_s >= max(m.xla_flops, m.model_flops) / (spec.peak_flops * spec.efficiency)
    assert m.mfu <= spec.efficiency
    assert "tpu-v5e-16" in str(first) and "cloud.google.com/tpu/docs/v5e" in str(first)


def test_a_scanned_gpt_is_planned_with_the_unrolled_ones_flops_and_collectives_on_a_tpu_slice():
    # XLA counts a loop's body once and XLA:TPU records no trip count: the planner reads the count
    # from the loop and counts the body per iteration, so `scan_layers` (and a scan over
    # micro-batches, now without an unrolled second compile) leaves the planned work as it was
    shape = dict(layers=3, width=64, heads=2, context=64)
    kwargs = dict(target="tpu-v5e-16", strategy=fj.strategies.FSDP(rules=gpt.GPT_RULES), precision="bf16-mixed",
                  sweep={"accumulate": [1, 2]})
    batch = [{"tokens": np.zeros((32, 65), np.int32)}]
    unrolled, scanned = (fj.plan(gpt.GPTModule(**shape, scan_layers=scan), batch, **kwargs).candidates
                         for scan in (False, True))
    assert [m.accumulate for m in scanned] == [m.accumulate for m in unrolled] == [1, 2]
    for u, s in zip(unrolled, scanned):
        assert s.xla_flops == pytest.approx(u.xla_flops, rel=0.01)  # measured: 0.03% apart
        assert s.model_flops == u.model_flops
        # fsdp's gathers of each block's weights, inside the loops: counted once they would be ~1/3;
        # measured 1-9% more for the scanned program (its own schedule of gathers), the reductions equal
        for kind, rel in (("all-gather", 0.15), ("all-reduce", 0.01)):
            assert s.collectives[kind].wire_bytes == pytest.approx(u.collectives[kind].wire_bytes, rel=rel)
    # 2 micro-batches of 16 rows: the work of one batch of 32 (counted once, the loop would make it half)
    assert scanned[1].xla_flops == pytest.approx(scanned[0].xla_flops, rel=0.02)


class Wide(fj.LitModule):
    """2 × 4096² × 48 float32 parameters (6 GiB), with Adam's two moments: 18 GiB of state."""

    def __init__(self):
        super().__init__()
        self.model = nn.Sequential([nn.Dense(4096 * 48, use_bias=False), nn.Dense(4096, use_bias=False)])

    def loss(self, model, batch):
        return ((model(batch["x"]) - batch["x"]) ** 2).mean()

    def configure_optimizer(self):
        return optax.adam(1e-3)


def test_a_model_too_big_for_a_v5e_chip_does_not_fit_with_dp_and_fsdp_is_recommended():
    data = [{"x": np.zeros((16, 4096), np.float32)}]
    plan = fj.plan(Wide(), data, target="tpu-v5e-16", sweep={"strategy": ["dp", "fsdp"]})
    by_name = {m.name: m for m in plan.candidates}
    # XLA:TPU refuses to compile a program over the chip's memory: the refusal is the answer
    assert by_name["dp"].fits is False and by_name["dp"].memory["params"] == 6 << 30
    assert "RESOURCE_EXHAUSTED" in by_name["dp"].out_of_memory and by_name["dp"].memory["peak"] > 16 << 30
    assert by_name["fsdp"].fits and plan.recommended is by_name["fsdp"]
    assert "dp does not fit" in plan.reason
    assert by_name["fsdp"].memory["params"] == (6 << 30) // 16


def test_bad_targets_say_what_to_use():
    module, data = digits.DigitsClassifier(), digits_data()
    trainer = quiet_trainer()
    with pytest.raises(ValueError, match=r"plan\(target=...\) got 'tpu-v9-8'.*tpu-v5e-16"):
        trainer.plan(module, data, target="tpu-v9-8")
    with pytest.raises(ValueError, match="a v5e slice has one of these sizes: 1, 4, 8, 16"):
        trainer.plan(module, data, target="tpu-v5e-12")
    with pytest.raises(ValueError, match="only be planned for on a machine that has one"):
        trainer.plan(module, data, target="gpu-h100")
    with pytest.raises(ValueError, match=r"headroom=...\) is the fraction"):
        trainer.plan(module, data, headroom=1.5)


def test_collectives_are_read_from_hlo_with_loop_trip_counts():
    hlo = """HloModule m, entry_computation_layout={()->f32[]}

%body (p: (s32[], f32[1024])) -> (s32[], f32[1024]) {
  %ar = f32[1024]{0} all-reduce(f32[1024]{0} %x), replica_groups=[1,8]<=[8], to_apply=%add
}

ENTRY %main () -> f32[] {
  %w = (s32[], f32[1024]) while((s32[], f32[1024]) %t), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"4"}}
  %ag = bf16[8,256]{1,0} all-gather(bf16[1,256]{1,0} %y), replica_groups={{0,1,2,3,4,5,6,7}}, dimensions={0}
}
"""
    found = planner.collectives(hlo, 8)
    assert found["all-reduce"].count == 4 and found["all-reduce"].bytes == 4 * 4096
    assert found["all-reduce"].wire_bytes == pytest.approx(4 * 4096 * 2 * 7 / 8)
    assert found["all-gather"] == planner.Collective("all-gather", 1, 8 * 256 * 2, 8 * 256 * 2 * 7 / 8)


def test_a_tpu_plan_twice_with_the_compile_cache_on_reads_nothing_back_from_it(tmp_path, recwarn):
    """A program compiled for a slice this process has no client for cannot come back from JAX's
    persistent cache (JAX warns at every later plan): plans compile for a topology with it off."""
    from helpers import persistent_compile_cache

    class Small(Wide):
        def __init__(self):
            fj.LitModule.__init__(self)
            self.model = nn.Sequential([nn.Dense(512, use_bias=False), nn.Dense(256, use_bias=False)])

    data = [{"x": np.zeros((16, 256), np.float32)}]
    with persistent_compile_cache(tmp_path / "xla"):
        plans = [fj.plan(Small(), data, target="tpu-v5e-8", strategy="fsdp") for _ in range(2)]
        assert jax.config.jax_enable_compilation_cache  # put back after each plan
    assert plans[0].recommended.memory == plans[1].recommended.memory
    assert not [w for w in recwarn if "persistent compilation cache" in str(w.message)], [str(w.message) for w in recwarn]
    assert not list((tmp_path / "xla").glob("*")), "a topology's program was written to the cache"


def test_a_collective_xla_copies_into_its_consumers_is_counted_once():
    # XLA:TPU's async collective fusion writes the all-gather again (its channel, another memory
    # space) in each fusion reading its data; the compiler's all-reduce-scatter helpers each number
    # their channels from 1, so a shared channel of other shapes is another collective
    hlo = """HloModule m, entry_computation_layout={()->f32[]}

%fused (p: bf16[1,256]) -> bf16[8,256] {
  %copy = bf16[8,256]{1,0:T(8,128)S(1)} all-gather(bf16[1,256]{1,0} %p), channel_id=3, replica_groups=[1,8]<=[8], dimensions={0}
}

ENTRY %main () -> f32[] {
  %ag = bf16[8,256]{1,0:T(8,128)} all-gather(bf16[1,256]{1,0} %y), channel_id=3, replica_groups=[1,8]<=[8], dimensions={0}
  %f = bf16[8,256]{1,0} fusion(bf16[8,256]{1,0} %ag), kind=kLoop, calls=%fused
  %other = bf16[8,512]{1,0} all-gather(bf16[1,512]{1,0} %z), channel_id=3, replica_groups=[1,8]<=[8], dimensions={0}
}
"""
    found = planner.collectives(hlo, 8)["all-gather"]
    assert (found.count, found.bytes) == (2, 8 * 256 * 2 + 8 * 512 * 2)
