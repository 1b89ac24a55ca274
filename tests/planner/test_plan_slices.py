"""Plans for TPU slices from a machine without them: the strategy's mesh built over the slice's
devices (not this machine's), and a `fitjax.models` Llama planned from its `config.json` through
`fitjax plan` (the path docs/guides/plan.md records for Llama-3.1-8B on v5e-16 and v5e-32).

Deviceless compiles with libtpu (the `dev` and `tpu-plan` extras); skipped where it is absent.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import quiet_trainer

import fitjax as fj
from fitjax.cli import LightningCLI
from fitjax.models import CausalLMModule
from fitjax.planner import TokenBatches
from fitjax.strategies import FSDP

pytestmark = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                reason="a TPU slice is compiled deviceless with libtpu: pip install 'fitjax[tpu-plan]'")

# Llama 3.1's layout (grouped key/value heads, llama3 rotary scaling, untied output layer) at a
# size that compiles in seconds
TINY_LLAMA = {"model_type": "llama", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "rope_theta": 500000.0,
              "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 8192}}
ROWS, LENGTH = 16, 128
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def llama_flops_per_token(config: dict, length: int) -> int:
    """6N + 12·layers·length·width, N without the token table (looked up, not multiplied)."""
    h, i, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    head = h // config["num_attention_heads"]
    kv = config["num_key_value_heads"] * head
    block = h * h * 2 + h * kv * 2 + 3 * h * i + 2 * h  # q, o; k, v; gate, up, down; two norms
    n = layers * block + h + h * config["vocab_size"]  # the final norm, the output layer
    return 6 * n + 12 * layers * length * h


def test_an_explicit_mesh_plans_for_a_tpu_slice_from_a_machine_with_one_device():
    module = CausalLMModule(TINY_LLAMA)
    strategy = FSDP(fsdp=4, tensor=2)
    with pytest.raises(ValueError, match=r"FSDP\(tensor=2\) does not divide the 1 selected devices"):
        quiet_trainer(strategy=strategy, devices=1)  # a trainer that fits here still refuses it at once
    plan = fj.plan(module, datamodule=TokenBatches(ROWS, LENGTH), target="tpu-v5e-8", strategy=strategy,
                   precision="bf16-mixed", devices=1)
    (m,) = plan.candidates
    assert (plan.devices, plan.device_kind) == (8, "TPU v5 lite")
    assert m.mesh == {"data": 1, "fsdp": 4, "tensor": 2} and m.fits and 0 < m.mfu < 1
    assert strategy._mesh is None  # the user's object is left as it was: the plan set up a copy
    # "auto" is resolved for the slice, not for the one device here: dp over its 8 chips
    (auto,) = fj.plan(module, datamodule=TokenBatches(ROWS, LENGTH), target="tpu-v5e-8", devices=1).candidates
    assert auto.mesh == {"data": 8}
    with pytest.raises(ValueError, match=r"Trainer.plan\(strategy='plan'\): a plan is what strategy='plan' asks"):
        quiet_trainer(devices=1).plan(module, datamodule=TokenBatches(ROWS, LENGTH), target="tpu-v5e-8",
                                      strategy="plan")


def test_a_llama_config_is_planned_for_a_slice_through_the_command_line(tmp_path, capsys):
    # the guide's command for Llama-3.1-8B (examples/configs/plan-llama-3.1-8b.yaml), on a tiny Llama
    (tmp_path / "config.json").write_text(json.dumps(TINY_LLAMA))
    args = ["plan", "--json", "--config", EXAMPLES / "configs" / "plan-llama-3.1-8b.yaml", "--model.config", tmp_path,
            "--data.batch_size", ROWS, "--data.length", LENGTH, "--trainer.devices", 1,
            "--trainer.strategy", "FSDP", "--trainer.strategy.tensor", 2, "--target", "tpu-v5e-8",
            "--trainer.default_root_dir", tmp_path]
    LightningCLI(args=[str(a) for a in args],
                 trainer_defaults={"enable_progress_bar": False, "enable_model_summary": False})
    out = json.loads(capsys.readouterr().out)
    assert (out["target"], out["devices"], out["recommended"]) == ("tpu-v5e-8", 8, "as configured")
    (m,) = out["candidates"]
    assert m["mesh"] == {"data": 1, "fsdp": 4, "tensor": 2} and m["precision"] == "bf16-mixed" and m["fits"]
    assert m["remat"] == "full"  # the config's: the model's FLOPs below leave the recomputation out
    # the model's work from its config and the batch: 6N (the token table is looked up) + attention
    assert m["model_flops_source"] == "6N+attention"
    assert m["model_flops"] == pytest.approx(llama_flops_per_token(TINY_LLAMA, LENGTH) * ROWS * LENGTH / 8)
    assert m["step_time_s"] > 0 and 0 < m["mfu"] < 1 and m["memory"]["peak"] > 0
    # the model's logical names put heads and MLP units on `tensor`: each chip holds less than
    # the 1/4 fsdp alone would leave it (measured 70,912 of 427,264 bytes: 1/6)
    total = 4 * sum(np.prod(x.shape) for x in jax.tree.leaves(jax.eval_shape(
        CausalLMModule(TINY_LLAMA).model.init, jax.random.key(0), jnp.zeros((1, 8), jnp.int32))))
    assert m["memory"]["params"] < total / 5
    assert not list(tmp_path.glob("**/config.yaml"))  # a plan writes nothing


def test_a_batch_of_shapes_is_planned_as_the_data_it_describes():
    module = CausalLMModule(TINY_LLAMA)
    shapes = {"tokens": jax.ShapeDtypeStruct((ROWS, LENGTH + 1), jnp.int32)}
    from_shapes = fj.plan(module, shapes, target="tpu-v5e-1", devices=1).candidates[0]
    from_data = fj.plan(module, datamodule=TokenBatches(ROWS, LENGTH), target="tpu-v5e-1", devices=1).candidates[0]
    assert from_shapes.memory == from_data.memory and from_shapes.xla_flops == from_data.xla_flops


def test_token_batches_give_one_batch_of_the_asked_shape_and_refuse_bad_sizes():
    (batch,) = list(TokenBatches(batch_size=4, length=8).train_dataloader())
    assert batch["tokens"].shape == (4, 9) and batch["tokens"].dtype == np.int32
    with pytest.raises(ValueError, match=r"TokenBatches\(length=...\) must be a positive int, got 0"):
        TokenBatches(batch_size=4, length=0)
    with pytest.raises(ValueError, match=r"TokenBatches\(batch_size=...\) must be a positive int, got 2.5"):
        TokenBatches(batch_size=2.5, length=8)
