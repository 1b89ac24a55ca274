"""Proof without a slice: `fj.nn.chunked_cross_entropy` under fsdp costs no collectives for its
chunks. A `fitjax.models` Llama's train step compiled deviceless for `tpu-v5e-8` moves as many
bytes between chips, in as many all-reduces, with its loss in 8 chunks as in one: the output
layer's weight gathered once a step, its gradient reduced once (the loop inside `shard_map`).
Before, each chunk gathered the weight and all-reduced the float32 gradient accumulator again
(measured here under fsdp: 12 all-reduces at 8 chunks against 4 at one, 6.03 MB of all-gathers
against 5.11 MB)."""

from __future__ import annotations

import importlib.util

import pytest
from test_attention_on_slices import LLAMA, _compiled

import fitjax as fj

pytestmark = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                reason="compiles for a TPU slice with libtpu: pip install -e '.[dev]'")

LENGTH = 128  # the loss in 8 chunks of 16 positions


@pytest.mark.parametrize("strategy", [lambda: fj.strategies.FSDP(), lambda: fj.strategies.FSDP(fsdp=4, tensor=2)],
                         ids=["fsdp", "fsdp-x-tensor"])
def test_the_chunked_loss_moves_no_more_than_one_chunk(strategy):
    """Layers scanned: unrolled, XLA:TPU's scheduler may overlap a layer's weight gather for the
    backward pass with the loss's loop, which `planner.collectives` then counts once per chunk."""
    from fitjax.models import CausalLMModule

    moved = {}
    for chunk in (LENGTH, LENGTH // 8):
        module = CausalLMModule(LLAMA, scan_layers=True, attention="xla", loss_chunk=chunk)
        text, _ = _compiled(module, strategy(), "tpu-v5e-8", length=LENGTH)
        moved[chunk] = fj.planner.collectives(text, 8)
    one, eight = moved[LENGTH], moved[LENGTH // 8]
    for kind in ("all-gather", "all-reduce"):
        assert eight[kind].bytes <= one[kind].bytes, (kind, eight, one)
    assert eight["all-reduce"].count == one["all-reduce"].count, (eight, one)
