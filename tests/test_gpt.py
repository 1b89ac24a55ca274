"""examples/gpt.py end to end: it learns, fsdp and fsdp × tensor give one device's numbers, a resumed
run is bitwise the uninterrupted one, generation through the KV cache follows the model's logits,
and `scan_layers` computes the unrolled model's numbers.

Every run combines the options at once: AdamW with warmup-cosine, clipping at 1.0, gradient
accumulation over 2 micro-batches, periodic checkpoints with validation, bf16 for the learning run.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from helpers import LossHistory, assert_trees_close, quiet_trainer  # first: it puts examples/ on the path

import gpt  # noqa: E402,I001
import flax.linen as nn
import jax.numpy as jnp
from jax.extend.core import jaxprs_in_params
from jax.sharding import PartitionSpec as P

import fitjax as fj

# 6 optimizer steps of 2 micro-batches of a 1-layer model, float32 so that strategies agree to
# float rounding; every checkpoint kept (steps 3 and 6) for the resume test; no samples printed
SHORT = ["--preset", "tiny", "--layers", "1", "--width", "32", "--heads", "2", "--context", "32", "--batch-size", "8",
         "--precision", "32-true", "--max-steps", "6", "--warmup", "2", "--log-every", "1", "--ckpt-every", "3",
         "--keep-checkpoints", "-1", "--sample-length", "0", "--no-progress-bar"]


def _host_leaves(tree) -> list[np.ndarray]:
    keys_as_data = lambda x: jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x  # noqa: E731
    return [np.asarray(x) for x in jax.tree.leaves(jax.device_get(jax.tree.map(keys_as_data, tree)))]


def _run(tmp_path, name, *args, callbacks=()):
    history = LossHistory()
    run = gpt.main([*SHORT, "--root-dir", str(tmp_path / name), *args], callbacks=[history, *callbacks])
    return run, history.losses


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("gpt"), "single", "--strategy", "single", "--devices", "1")


@pytest.fixture(scope="module")
def fsdp_tensor(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpt")
    return root, _run(root, "fsdp_tensor", "--strategy", "fsdp", "--tensor", "2")


def test_tiny_preset_learns_with_fsdp_bf16_accumulation_and_clipping(tmp_path):
    # uniform bytes: ln 256 = 5.55 nats; the corpus' unigram entropy: 3.26 nats
    run = gpt.main(["--preset", "tiny", "--devices", "2", "--no-progress-bar", "--root-dir", str(tmp_path)])
    assert run.trainer.global_step == 100
    assert run.metrics["val/loss"] < 2.8
    assert run.metrics["val/ppl"] == pytest.approx(np.exp(run.metrics["val/loss"]))
    assert run.metrics["train/items_per_sec"] > 0 and run.metrics["train/flops_per_sec"] > 0  # 2 devices
    assert [step for step, _ in run.samples.history] == [100]
    assert len(run.samples.history[0][1]) == len(gpt.Samples.PROMPTS)
    assert sorted(p.name for p in (tmp_path / "fitjax_logs" / "version_0" / "checkpoints").iterdir()
                  if p.name.startswith("epoch")) != []


@pytest.mark.parametrize("args", [("--strategy", "fsdp"), None], ids=["fsdp8", "fsdp4xtensor2"])
def test_fsdp_and_fsdp_x_tensor_match_one_device(single, fsdp_tensor, tmp_path, args):
    (ref, ref_losses) = single
    run, losses = _run(tmp_path, "fsdp", *args) if args else fsdp_tensor[1]
    assert len(losses) == len(ref_losses) == 6
    # float32; the sums over devices are ordered differently: agreement to ~1e-6 relative
    np.testing.assert_allclose(losses, ref_losses, rtol=2e-5)
    assert_trees_close(run.trainer.state.params, ref.trainer.state.params, rtol=2e-4, atol=2e-5)
    assert run.metrics["val/loss"] == pytest.approx(ref.metrics["val/loss"], rel=2e-5)
    # each device's FLOPs (XLA's count) x 8 against PaLM's count of the model's: fsdp splits the
    # work (1.11x measured: replicated small work); a tensor axis repeats the elementwise work
    # on activations each of its devices holds whole (1.52x measured)
    palm = gpt.flops_per_token(layers=1, width=32, context=32)
    assert 1.0 <= _flops_per_token(run, "hardware_flops_per_sec") / palm <= (1.15 if args else 1.6)
    assert run.metrics["train/flops_per_sec"] == pytest.approx(8 * run.metrics["train/device/flops_per_sec"])

    mesh = run.trainer.strategy.mesh
    tensor = 1 if args else 2
    assert dict(mesh.shape) == {"data": 1, "fsdp": 8 // tensor, "tensor": tensor}
    block = run.trainer.state.params["h_0"]  # fitjax.models' GPT-2 layout, split by its LOGICAL_RULES
    assert block["attn"]["q_proj"]["kernel"].sharding.spec == P("fsdp", "tensor")  # [embed, heads × head_dim]
    assert block["attn"]["c_proj"]["kernel"].sharding.spec == P("tensor", "fsdp")
    assert block["mlp"]["c_fc"]["kernel"].sharding.spec == P("fsdp", "tensor")  # [embed, mlp]
    assert block["mlp"]["c_proj"]["kernel"].sharding.spec == P("tensor", "fsdp")  # [mlp, embed]
    shard = block["mlp"]["c_fc"]["kernel"].addressable_shards[0].data.shape
    assert shard == (32 // (8 // tensor), 128 // tensor)  # [width, 4 * width] split fsdp × tensor ways
    moments = [leaf for path, leaf in jax.tree_util.tree_flatten_with_path(run.trainer.state.opt_state)[0]
               if jax.tree_util.keystr(path).endswith("['h_0']['mlp']['c_fc']['kernel']")]
    assert len(moments) == 2 and all(m.sharding.spec == P("fsdp", "tensor") for m in moments)  # Adam's mu, nu


def test_resumed_fsdp_x_tensor_run_is_bitwise_the_uninterrupted_one(fsdp_tensor):
    root, (full, full_losses) = fsdp_tensor
    checkpoints = root / "fsdp_tensor" / "fitjax_logs" / "version_0" / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["epoch=0-step=3", "epoch=0-step=6"]
    # a new trainer, module and data loader, restored from the files written at step 3
    resumed, losses = _run(root, "resumed", "--strategy", "fsdp", "--tensor", "2",
                           "--resume", str(checkpoints / "epoch=0-step=3"))
    assert resumed.trainer.global_step == 6
    assert losses == full_losses[3:]  # bitwise, step by step
    for a, b in zip(_host_leaves(resumed.trainer.state), _host_leaves(full.trainer.state), strict=True):
        np.testing.assert_array_equal(a, b)
    assert resumed.metrics["val/loss"] == full.metrics["val/loss"]


def _flops_per_token(run, key: str = "flops_per_sec") -> float:
    metrics = run.throughput.metrics  # one device's FLOP/s over its tokens/s: one device's FLOPs a token
    return metrics[f"train/device/{key}"] / metrics["train/device/items_per_sec"]


def test_the_monitors_flops_agree_with_palms_6n_plus_attention_count(single):
    # the model's FLOPs (MFU's): 6N + attention from the module's declared `transformer_shape`,
    # N every parameter (PaLM's count takes the matmuls' only: position embeddings, norms and
    # biases make 1.05x here)
    run = single[0]
    palm = gpt.flops_per_token(layers=1, width=32, context=32)
    assert 1.0 <= _flops_per_token(run) / palm <= 1.1
    # the hardware's: XLA counts every operation of the compiled step. Measured: 1.08x PaLM's
    # (LayerNorm, softmax, GELU and AdamW on top)
    assert 1.0 <= _flops_per_token(run, "hardware_flops_per_sec") / palm <= 1.15
    tokens_per_step = 2 * 8 * 32  # accumulate x batch x context
    assert run.trainer.train_step_flops() / tokens_per_step == pytest.approx(
        _flops_per_token(run, "hardware_flops_per_sec"), rel=1e-6)


def test_generation_follows_the_models_argmax_with_and_without_the_cache(single):
    run, _ = single
    trainer, module = run.trainer, run.module
    params = trainer.state.params
    prompts = [gpt.encode(p).tolist() for p in ("The a", "def f(x):")]  # token ids in, token ids out
    new = trainer.generate(module, prompts, max_new_tokens=20, temperature=0)
    assert new == trainer.generate(module, prompts, max_new_tokens=20, temperature=0, use_cache=False)
    apply = jax.jit(module.model.apply)  # eagerly each op compiles on its own: slower
    for prompt, tokens in zip(prompts, new):  # greedy: each byte is the argmax given the bytes before it
        logits = apply({"params": params}, jnp.asarray([prompt + tokens]))[0]
        np.testing.assert_array_equal(logits[len(prompt) - 1:-1].argmax(-1), tokens)
    texts = trainer.generate(module, ["The a", "def f(x):"], max_new_tokens=20, temperature=0.8, seed=1)
    assert len(texts) == 2 and all(isinstance(t, str) and t for t in texts)  # module.tokenizer: bytes


def test_the_scanned_models_cache_gives_the_logits_of_the_whole_sequence():
    """A prefill of 5 tokens, then 3 one-token steps through the cache stacked on a layer axis:
    the logits the model computes over all 8 at once (the unrolled model's cache: the generation
    test above)."""
    model = gpt.gpt_model(layers=2, width=32, heads=2, context=16, scan_layers=True)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 256, (2, 8)), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(8), (2, 8))

    def both(variables):
        cache = model.init_cache(2, 16, jnp.float32)
        steps = []
        for start, end in ((0, 5), (5, 6), (6, 7), (7, 8)):
            logits, cache = model.apply(variables, tokens[:, start:end], positions=positions[:, start:end], cache=cache)
            steps.append(logits)
        return model.apply(variables, tokens), jnp.concatenate(steps, axis=1), cache

    want, got, cache = jax.jit(both)(jax.jit(model.init)(jax.random.key(0), tokens))
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert cache.keys.shape == (2, 2, 16, 2, 16)  # [layers, batch, length, heads, head_dim]


def test_resuming_a_finished_run_says_there_is_nothing_left_to_train(single, tmp_path, capsys):
    (ref, _) = single
    last = ref.trainer.checkpoint_callback.last_model_path  # step 6 of --max-steps 6
    capsys.readouterr()
    run, losses = _run(tmp_path, "again", "--strategy", "single", "--devices", "1", "--resume", last)
    assert run.trainer.global_step == 6 and losses == []
    assert ("nothing left to train: the checkpoint is at step 6 and --max-steps is 6; pass a larger --max-steps "
            "to train on") in capsys.readouterr().out


def _stacked(params, layers: int):
    """The unrolled model's parameters in `scan_layers`' layout: `h_i` stacked as `h`."""
    blocks = [params[f"h_{i}"] for i in range(layers)]
    rest = {k: v for k, v in params.items() if not k.startswith("h_")}
    return {**rest, "h": jax.tree.map(lambda *xs: jnp.stack(xs), *blocks)}


def _primitives(jaxpr, depth=0):
    """(depth, primitive name) of every equation, sub-jaxprs (a scan's body, a remat's) one deeper."""
    for eqn in jaxpr.eqns:
        yield depth, eqn.primitive.name
        for sub in jaxprs_in_params(eqn.params):
            yield from _primitives(sub, depth + 1)


@pytest.mark.parametrize("remat", ["none", "full"])
def test_scanned_blocks_compute_the_unrolled_models_loss_and_gradients(remat):
    from fitjax.step.remat import remat_layers

    shape = dict(layers=2, width=32, heads=2, context=16)
    unrolled, scanned = gpt.gpt_model(**shape), gpt.gpt_model(**shape, scan_layers=True)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 256, (4, 17)), jnp.int32)
    # jitted (eagerly each op compiles on its own); the scanned init is read for its layout only
    params = nn.unbox(jax.jit(unrolled.init)(jax.random.key(0), tokens[:, :-1]))["params"]
    stacked = _stacked(params, 2)
    assert jax.tree.structure(stacked) == jax.tree.structure(
        nn.unbox(jax.eval_shape(scanned.init, jax.random.key(0), tokens[:, :-1]))["params"])

    module = gpt.GPTModule(**shape)
    loss = lambda model, p: module.loss(model.bind({"params": p}), {"tokens": tokens})  # noqa: E731
    with remat_layers(remat):  # what Trainer(remat=...) traces the step under
        want, want_grads = jax.jit(jax.value_and_grad(lambda p: loss(unrolled, p)))(params)
        got, got_grads = jax.jit(jax.value_and_grad(lambda p: loss(scanned, p)))(stacked)
        jaxpr = jax.make_jaxpr(lambda p: loss(scanned, p))(stacked).jaxpr
    assert float(got) == pytest.approx(float(want), rel=1e-6)
    assert_trees_close(got_grads, _stacked(want_grads, 2), rtol=1e-5, atol=1e-7)
    # remat composes with the scan: each iteration's block is rematerialized inside the loop's body
    # (a checkpoint around the whole scan would keep every layer's activations for the backward pass)
    # as one checkpoint (not one per Dense or LayerNorm in it); the embedding and the final norm at the top
    found = list(_primitives(jaxpr))
    # the blocks' scan, then the chunked loss' own (inside its custom VJP)
    assert [d for d, name in found if name == "scan"] == [0, 1]
    assert sorted(d for d, name in found if name == "remat2") == ([0, 0, 1] if remat == "full" else [])


def test_scanned_blocks_train_under_fsdp_x_tensor_with_remat_and_keep_the_layer_axis_whole():
    module = gpt.GPTModule(layers=2, width=32, heads=2, context=32, lr=1e-2, warmup=1, total_steps=4,
                           scan_layers=True)
    train, _ = gpt.splits(32)
    history = LossHistory()
    trainer = quiet_trainer(strategy=gpt.strategy_for("fsdp", tensor=2), max_steps=4, remat="full",
                            callbacks=[history])
    trainer.fit(module, fj.DataLoader(train, batch_size=8, shuffle=True, seed=0, drop_last=True))
    assert len(history.losses) == 4 and history.losses[-1] < history.losses[0]
    blocks = trainer.state.params["h"]
    # [layers, ...]: the layer axis ("layers" -> None in LOGICAL_RULES) on every device, the rest as unrolled
    assert blocks["mlp"]["c_fc"]["kernel"].shape == (2, 32, 128)
    assert blocks["mlp"]["c_fc"]["kernel"].sharding.spec == P(None, "fsdp", "tensor")
    assert blocks["attn"]["c_proj"]["kernel"].sharding.spec == P(None, "tensor", "fsdp")
    assert blocks["mlp"]["c_fc"]["kernel"].addressable_shards[0].data.shape == (2, 32 // 4, 128 // 2)
