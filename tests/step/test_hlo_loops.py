"""`fitjax.step.hlo_loops`: XLA's cost of a compiled program with each loop body counted once per
iteration (XLA counts it once), the trip counts read from XLA's record or from the loop itself."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest

from fitjax.step import hlo_loops, jitted


def _tower(w, x, *, unroll):
    def layer(x, w):
        def twice(_, x):  # a loop inside the loop's body
            return jnp.tanh(x @ w)
        return jax.lax.fori_loop(0, 2, twice, x, unroll=unroll is True), None
    return jax.lax.scan(layer, x, w, unroll=unroll)[0].sum()


def test_a_scans_flops_and_bytes_count_every_iteration_like_the_unrolled_programs():
    w = jax.ShapeDtypeStruct((6, 128, 128), jnp.float32)
    x = jax.ShapeDtypeStruct((64, 128), jnp.float32)
    looped = jax.jit(functools.partial(_tower, unroll=1)).lower(w, x).compile()
    unrolled = jax.jit(functools.partial(_tower, unroll=True)).lower(w, x).compile()
    matmuls = 6 * 2 * 2 * 64 * 128 * 128  # 6 layers x 2 repeats, 2 FLOPs a multiply-add
    raw = jitted.cost_of(unrolled)["flops"]
    assert raw == pytest.approx(matmuls, rel=0.05)
    assert looped.cost_analysis()["flops"] < matmuls / 6  # XLA's own count: each body once
    assert jitted.cost_of(looped)["flops"] == pytest.approx(raw, rel=0.01)
    assert jitted.cost_of(looped)["bytes accessed"] > 6 * looped.cost_analysis()["bytes accessed"] / 2
    assert hlo_loops.per_iteration(unrolled.as_text(), {"flops": 1.0}) == {"flops": 1.0}  # no loop: XLA's


# XLA:TPU's shape of a scan over 4 layers, which records no trip count: the counter starts from a
# copy of a constant, steps by 1 in the body (through a copy) and is compared with 4 (the
# instructions' operands printed without types, as XLA:TPU prints them)
TPU_STYLE = """HloModule jit_step, is_scheduled=true, entry_computation_layout={(f32[4,8]{1,0})->f32[8]{0}}

%body (p: (s32[], f32[8])) -> (s32[], f32[8]) {
  %p = (s32[]{:T(128)}, f32[8]{0}) parameter(0)
  %i = s32[]{:T(128)} get-tuple-element(%p), index=0
  %i.copy = s32[]{:T(128)} copy(%i)
  %one = s32[]{:T(128)} constant(STEP)
  %next = s32[]{:T(128)} add(%i.copy, %one)
  %x = f32[8]{0} get-tuple-element(%p), index=1
  %ar = f32[8]{0} all-reduce(%x), replica_groups=[1,8]<=[8], to_apply=%add
  ROOT %t = (s32[]{:T(128)}, f32[8]{0}) tuple(%next, %ar)
}

%cond (p.1: (s32[], f32[8])) -> pred[] {
  %p.1 = (s32[]{:T(128)}, f32[8]{0}) parameter(0)
  %limit = s32[]{:T(128)} constant(LIMIT)
  %i.1 = s32[]{:T(128)} get-tuple-element(%p.1), index=0
  ROOT %lt = pred[]{:T(512)} compare(%i.1, %limit), direction=LT
}

ENTRY %main (w: f32[4,8]) -> f32[8] {
  %zero = s32[]{:T(128)} constant(START)
  %start = s32[]{:T(128)} copy(%zero)
  %x0 = f32[8]{0} constant({...})
  %init = (s32[]{:T(128)}, /*index=1*/f32[8]{0}) tuple(%start, %x0)
  %loop = (s32[]{:T(128)}, /*index=1*/f32[8]{0}) while(%init), condition=%cond, body=%body
  ROOT %out = f32[8]{0} get-tuple-element(%loop), index=1
}
"""


@pytest.mark.parametrize(("start", "limit", "step", "trips"), [(0, 4, 1, 4), (2, 11, 3, 3), (5, 4, 1, 0)])
def test_a_loops_trip_count_is_read_from_its_counter_where_xla_recorded_none(start, limit, step, trips):
    hlo = TPU_STYLE.replace("START", str(start)).replace("LIMIT", str(limit)).replace("STEP", str(step))
    assert hlo_loops.trip_counts(hlo) == {"main": 1, "cond": 1, "body": trips}


def test_a_loop_whose_count_cannot_be_read_is_counted_once():
    hlo = TPU_STYLE.replace("%start = s32[]{:T(128)} copy(%zero)", "%start = s32[]{:T(128)} add(%zero, %zero)")
    assert hlo_loops.trip_counts(hlo.replace("START", "0").replace("LIMIT", "4").replace("STEP", "1"))["body"] == 1
