"""Proof without a slice: the train step with the TPU attention kernel compiles deviceless for
TPU v5e slices under dp, fsdp and fsdp × tensor (the kernel inside `shard_map`, `fitjax.nn._splash`),
and moves no more between chips than the same step with the plain path (`attention="xla"`): the
collectives' bytes read from the compiled program (`fitjax.planner.collectives`)."""

from __future__ import annotations

import importlib.util
import math

import jax
import jax.numpy as jnp
import pytest
from helpers import quiet_trainer  # noqa: F401  (first: it puts examples/ on the path)

import gpt  # noqa: E402,I001

import fitjax as fj
from fitjax import planner
from fitjax.nn import _kernels
from fitjax.step import jitted

pytestmark = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                reason="compiles for a TPU slice with libtpu: pip install -e '.[dev]'")

GPT = dict(layers=2, width=256, heads=4, context=128)  # head_dim 64, 128 tokens: the kernel applies
LLAMA = {"model_type": "llama", "vocab_size": 256, "hidden_size": 256, "intermediate_size": 512,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}
# 4 query heads over 2 key/value heads, head_dim 64: under tensor=2 each device holds 2 and 1
GROUPED_LLAMA = LLAMA
_TARGETS: dict[str, planner.Target] = {}


def _compiled(module, strategy, target_name: str, *, length: int = GPT["context"], compiled: list | None = None
              ) -> tuple[str, dict[str, int]]:
    """The compiled train step's HLO text for the target (16 rows of `length` positions), and its
    collectives' bytes by kind; the compiled executable and its abstract state appended to
    `compiled` when given."""
    if target_name not in _TARGETS:
        _TARGETS[target_name] = planner.resolve_target(target_name, jax.devices())
    target = _TARGETS[target_name]
    strategy.setup(target.devices)
    batch = {"tokens": jax.ShapeDtypeStruct((16, length + 1), jnp.int32)}
    with planner.quiet_stderr():
        program = jitted.abstract_train(module.step_spec(), strategy, batch)
        executable = program.train_step.lower(program.state, program.inputs).compile()
    if compiled is not None:
        compiled.append((executable, program.state))
    text = executable.as_text()
    return text, {kind: c.bytes for kind, c in planner.collectives(text, len(target.devices)).items()}


def _moves_no_more(kernel: dict[str, int], plain: dict[str, int]) -> None:
    """The step with the kernel moves no more than with the plain path, kind by kind: no attention
    input or output crosses chips. Measured: the same bytes of every kind in every case here (fsdp
    gathers the same weights either way; counted as `planner.collectives` counts them, once per
    collective however many copies XLA:TPU writes into the fusions reading it)."""
    assert kernel and set(kernel) <= set(plain), (kernel, plain)
    for kind, moved in kernel.items():
        assert moved <= plain[kind], (kind, kernel, plain)


@pytest.mark.parametrize("target, strategy, scan", [
    ("tpu-v5e-8", lambda: fj.strategies.FSDP(rules=gpt.GPT_RULES), False),            # the example's default
    ("tpu-v5e-8", lambda: fj.strategies.FSDP(tensor=2, rules=gpt.GPT_RULES), False),  # 2 heads a chip
    ("tpu-v5e-16", lambda: fj.strategies.DataParallel(), True),
    ("tpu-v5e-16", lambda: fj.strategies.FSDP(tensor=4, rules=gpt.GPT_RULES), True),   # 1 head a chip: --scan-layers
], ids=["v5e-8-fsdp", "v5e-8-fsdp-tensor", "v5e-16-dp-scan", "v5e-16-fsdp-tensor-scan"])
def test_the_gpt_examples_step_with_the_kernel_compiles_for_a_slice_and_moves_no_more(target, strategy, scan):
    kernel, kernel_bytes = _compiled(gpt.GPTModule(**GPT, scan_layers=scan), strategy(), target)
    plain, plain_bytes = _compiled(gpt.GPTModule(**GPT, scan_layers=scan, attention="xla"), strategy(), target)
    # forward, dq and dkv kernels (once: in the scanned body, or per layer)
    assert kernel.count("tpu_custom_call") == (3 if scan else 3 * GPT["layers"]) and "tpu_custom_call" not in plain
    _moves_no_more(kernel_bytes, plain_bytes)


def test_an_imported_llamas_step_with_the_kernel_compiles_for_a_slice_and_moves_no_more(monkeypatch):
    """`fitjax.models` (grouped KV heads) under fsdp; its kernel choice through the environment,
    which overrides what the model asks for."""
    from fitjax.models import CausalLMModule

    found = {}
    for kernel in ("splash", "xla"):
        monkeypatch.setenv(_kernels.ATTENTION_ENV, kernel)
        found[kernel] = _compiled(CausalLMModule(LLAMA), fj.strategies.FSDP(), "tpu-v5e-16")
    (kernel, kernel_bytes), (plain, plain_bytes) = found["splash"], found["xla"]
    assert kernel.count("tpu_custom_call") == 3 * LLAMA["num_hidden_layers"] and "tpu_custom_call" not in plain
    _moves_no_more(kernel_bytes, plain_bytes)


@pytest.mark.parametrize("scan", [True, False], ids=["scan", "unrolled"])
def test_an_imported_llama_under_fsdp_x_tensor_compiles_with_the_kernel_moves_no_more_and_splits_over_all(scan):
    """`fitjax.models`' Llama (grouped KV heads, 128 positions: the kernel's smallest block) under `FSDP(fsdp=4, tensor=2)` for
    `tpu-v5e-8`, its rules the module's own (`LOGICAL_RULES`): the kernel's step moves no more than
    the plain path's, and the compiled program takes every decoder kernel split over all 8 chips."""
    from fitjax.models import CausalLMModule

    compiled: list = []
    kernel, kernel_bytes = _compiled(CausalLMModule(GROUPED_LLAMA, scan_layers=scan),
                                     fj.strategies.FSDP(fsdp=4, tensor=2), "tpu-v5e-8", compiled=compiled)
    plain, plain_bytes = _compiled(CausalLMModule(GROUPED_LLAMA, scan_layers=scan, attention="xla"),
                                   fj.strategies.FSDP(fsdp=4, tensor=2), "tpu-v5e-8")
    assert kernel.count("tpu_custom_call") == (3 if scan else 3 * GROUPED_LLAMA["num_hidden_layers"])
    assert "tpu_custom_call" not in plain
    _moves_no_more(kernel_bytes, plain_bytes)

    executable, state = compiled[0]
    params = executable.input_shardings[0][0].params  # the layout the compiled step takes the state in
    leaves = jax.tree_util.tree_leaves_with_path
    shapes = {jax.tree_util.keystr(path): leaf.shape for path, leaf in leaves(state.params)}
    layers = ["['layers']"] if scan else [f"['layers_{i}']" for i in range(GROUPED_LLAMA["num_hidden_layers"])]
    lead = (None,) if scan else ()  # the stacked layers' axis: every chip keeps every layer's slice
    split = {"['self_attn']['q_proj']": ("fsdp", "tensor"), "['self_attn']['k_proj']": ("fsdp", "tensor"),
             "['self_attn']['v_proj']": ("fsdp", "tensor"), "['self_attn']['o_proj']": ("tensor", "fsdp"),
             "['mlp']['gate_proj']": ("fsdp", "tensor"), "['mlp']['up_proj']": ("fsdp", "tensor"),
             "['mlp']['down_proj']": ("tensor", "fsdp")}  # heads and MLP units over tensor (Megatron)
    found = {jax.tree_util.keystr(path): sharding for path, sharding in leaves(params)}
    for key, spec in ((f"{layer}{name}['kernel']", spec) for layer in layers for name, spec in split.items()):
        assert tuple(found[key].spec) == (*lead, *spec), (key, found[key].spec)
        shard, whole = found[key].shard_shape(shapes[key]), shapes[key]
        assert math.prod(shard) * 8 == math.prod(whole), (key, shard, whole)  # 1/8 on each chip
    # the vocabulary stays whole (`LOGICAL_RULES`' "vocab": None): the embedding and the output layer
    # are split over fsdp only, a quarter on each chip
    for key in ("['embed_tokens']['embedding']", "['lm_head']['kernel']"):
        assert "fsdp" in tuple(found[key].spec) and "tensor" not in tuple(found[key].spec), (key, found[key].spec)
