"""fitjax.models as the one decoder: its logical axis names split a Llama over fsdp × tensor with no
rules given (the numbers of one device), `scan_layers` computes the unrolled model's logits, loss
and cached generation from the same (stacked) weights and maps them to and from a `transformers`
folder, and the chunked loss is the full-logits one."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import LossHistory, assert_trees_close, perturbed_transformers_model, quiet_trainer
from jax.sharding import PartitionSpec as P

import fitjax as fj
from fitjax import models

LLAMA = {"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64}
GPT2 = {"model_type": "gpt2", "vocab_size": 64, "n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 64}
TOKENS = np.random.default_rng(0).integers(0, 64, (16, 17)).astype(np.int32)


def _fit(strategy):
    history = LossHistory()
    module = models.CausalLMModule(LLAMA, lr=1e-2)
    trainer = quiet_trainer(strategy=strategy, max_steps=3, callbacks=[history])
    trainer.fit(module, fj.DataLoader({"tokens": TOKENS}, batch_size=8))
    return trainer, history.losses


def test_a_llama_under_fsdp_x_tensor_is_one_device_and_split_over_all_eight():
    single, want = _fit("single")
    trainer, got = _fit(fj.strategies.FSDP(fsdp=4, tensor=2))  # no rules: the module's LOGICAL_RULES
    assert len(got) == 3
    np.testing.assert_allclose(got, want, rtol=1e-5)
    layer = trainer.state.params["layers_0"]
    attn, mlp = layer["self_attn"], layer["mlp"]
    assert attn["q_proj"]["kernel"].sharding.spec == P("fsdp", "tensor")  # [embed, heads x head_dim]
    assert attn["k_proj"]["kernel"].sharding.spec == P("fsdp", "tensor")  # [embed, kv_heads x head_dim]
    assert attn["o_proj"]["kernel"].sharding.spec == P("tensor", "fsdp")
    assert mlp["gate_proj"]["kernel"].sharding.spec == P("fsdp", "tensor")  # [embed, mlp]
    assert mlp["down_proj"]["kernel"].sharding.spec == P("tensor", "fsdp")
    assert trainer.state.params["embed_tokens"]["embedding"].sharding.spec == P(None, "fsdp")  # [vocab, embed]
    for kernel in (attn["q_proj"]["kernel"], attn["v_proj"]["kernel"], mlp["up_proj"]["kernel"]):
        assert len({str(shard.index) for shard in kernel.addressable_shards}) == 8  # a different piece on each device
    # the user's strategy is left as it was made; the module's rules only fill what it leaves out
    assert trainer.strategy.rules == {}
    merged = fj.strategies.FSDP(rules={"mlp": None}).with_model_rules(models.LOGICAL_RULES)
    assert merged.rules["mlp"] is None and merged.rules["heads"] == "tensor"


class _SGDLlama(models.CausalLMModule):
    # plain SGD: the update is the gradient (Adam's first step is lr × sign(gradient), which turns
    # float rounding of a near-zero gradient into a whole step)
    def configure_optimizer(self):
        return optax.sgd(self.hparams.lr)


def test_a_scanned_llama_with_the_tpu_kernel_under_fsdp_x_tensor_is_one_device():
    """The splash kernel (in Pallas' interpreter: tiny shapes, its smallest block) inside `shard_map`
    over fsdp 4 × tensor 2, in `scan_layers`' body: a train step's loss and updated parameters are
    one device's."""
    config = {**LLAMA, "hidden_size": 128, "intermediate_size": 128, "num_attention_heads": 2,
              "num_key_value_heads": 1}  # head_dim 64; one query head a device, the key head repeated
    tokens = np.random.default_rng(1).integers(0, 64, (4, 129)).astype(np.int32)  # 128 positions

    def step(strategy):
        history = LossHistory()
        module = _SGDLlama(config, lr=1.0, scan_layers=True, attention="pallas")
        trainer = quiet_trainer(strategy=strategy, max_steps=1, callbacks=[history], log_every_n_steps=1)
        trainer.fit(module, fj.DataLoader({"tokens": tokens}, batch_size=4))
        return history.losses, jax.device_get(trainer.state.params)

    want_loss, want = step("single")  # measured: the step moves the norms' scales by 0.02-0.03
    got_loss, got = step(fj.strategies.FSDP(fsdp=4, tensor=2))
    assert len(got_loss) == 1
    np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5)
    assert_trees_close(got, want, rtol=1e-5, atol=1e-5)


def _stacked(params, config):
    prefix = "h" if config.gpt2_layout else "layers"
    layers = [params.pop(f"{prefix}_{i}") for i in range(config.num_layers)]
    return {**params, prefix: jax.tree.map(lambda *xs: jnp.stack(xs), *layers)}


@pytest.mark.parametrize("config", [LLAMA, GPT2], ids=["llama", "gpt2"])
def test_scanned_layers_compute_the_unrolled_models_numbers_and_cache(config):
    unrolled, scanned = models.from_config(config), models.from_config(config, scan_layers=True)
    tokens = jnp.asarray(TOKENS[:2, :8])
    params = nn.unbox(jax.jit(unrolled.init)(jax.random.key(0), tokens))["params"]  # eager: op by op, slower
    stacked = _stacked(dict(params), unrolled.config)
    boxed = jax.eval_shape(scanned.init, jax.random.key(0), tokens)["params"]  # the layout only: no numbers
    assert jax.tree.structure(stacked) == jax.tree.structure(nn.unbox(boxed))
    prefix = "h" if unrolled.config.gpt2_layout else "layers"
    assert all(names[0] == "layers" for names in
               jax.tree.leaves(nn.get_partition_spec(boxed[prefix]), is_leaf=lambda x: isinstance(x, P)))

    def run(model, p):
        whole = model.apply({"params": p}, tokens)
        loss = model.apply({"params": p}, tokens[:, :-1], targets=tokens[:, 1:], loss_chunk=3).mean
        cache, steps = model.init_cache(2, 12), []
        for start, end in ((0, 5), (5, 6), (6, 7), (7, 8)):  # a prompt, then one token at a time
            logits, cache = model.apply({"params": p}, tokens[:, start:end], cache=cache)
            steps.append(logits)
        return whole, loss, jnp.concatenate(steps, axis=1), cache

    want, want_loss, want_steps, want_cache = jax.jit(lambda p: run(unrolled, p))(params)
    got, got_loss, got_steps, got_cache = jax.jit(lambda p: run(scanned, p))(stacked)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    assert float(got_loss) == pytest.approx(float(want_loss), rel=1e-6)
    np.testing.assert_allclose(got_steps, want, atol=1e-5, rtol=0)  # the cache's logits are the whole sequence's
    np.testing.assert_allclose(want_steps, want, atol=1e-5, rtol=0)
    assert got_cache.keys.shape == (2, 2, 12, unrolled.config.num_kv_heads, unrolled.config.head_dim)
    np.testing.assert_allclose(got_cache.keys, want_cache.keys, atol=1e-5, rtol=0)  # one layout, both ways


def test_greedy_generation_with_scanned_layers_equals_the_unrolled_models():
    trainer = quiet_trainer(strategy="single")
    unrolled = models.CausalLMModule(GPT2)

    @jax.jit  # eagerly, each op of the init compiles on its own: slower than the whole
    def init():
        params = nn.unbox(unrolled.model.init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32)))["params"]
        return jax.tree.map(lambda x: x + 0.3 * jax.random.normal(jax.random.key(1), x.shape), params)

    params = init()
    fj.module.set_variables(unrolled, params, {})
    scanned = models.CausalLMModule(GPT2, scan_layers=True)
    fj.module.set_variables(scanned, _stacked(dict(params), unrolled.model.config), {})
    prompts = [[5, 6, 7, 8, 9], [10, 11, 12]]
    want = trainer.generate(unrolled, prompts, max_new_tokens=8, temperature=0)
    assert trainer.generate(scanned, prompts, max_new_tokens=8, temperature=0) == want
    assert trainer.generate(unrolled, prompts, max_new_tokens=8, temperature=0, use_cache=False) == want


def _old_loss(model, params, batch):
    """`CausalLMModule`'s loss before the chunked one: the whole float32 logits."""
    if "targets" in batch:
        logits = model.apply({"params": params}, batch["tokens"], positions=batch["positions"],
                             segment_ids=batch["segment_ids"])
        per_token = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), batch["targets"])
        return (per_token * batch["loss_mask"]).sum() / batch["loss_mask"].sum()
    tokens, segments = batch["tokens"], batch.get("segment_ids")
    logits = model.apply({"params": params}, tokens[:, :-1], segment_ids=None if segments is None else segments[:, :-1])
    per_token = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), tokens[:, 1:])
    if segments is None:
        return per_token.mean()
    counted = (segments[:, 1:] == segments[:, :-1]) & (segments[:, 1:] != 0)
    return jnp.where(counted, per_token, 0.0).sum() / counted.sum()


@pytest.mark.parametrize("config", [LLAMA, {**GPT2, "tie_word_embeddings": True}], ids=["untied", "tied"])
def test_the_chunked_loss_is_the_full_logits_loss(config):
    module = models.CausalLMModule(config, loss_chunk=5)  # chunks of 5 over 16 positions: the last one padded
    rng = np.random.default_rng(2)
    segments = np.repeat([[1] * 9 + [2] * 6 + [0] * 2], 4, axis=0).astype(np.int32)
    text = {"tokens": TOKENS[:4, :-1], "targets": TOKENS[:4, 1:], "loss_mask": rng.random((4, 16)) < 0.7,
            "segment_ids": segments[:, :-1], "positions": np.broadcast_to(np.arange(16), (4, 16)).astype(np.int32)}
    batches = [{"tokens": TOKENS[:4]}, {"tokens": TOKENS[:4], "segment_ids": segments}, text]
    params = nn.unbox(jax.jit(module.model.init)(jax.random.key(0), jnp.asarray(TOKENS[:1, :4])))["params"]
    # jitted both: eagerly each op compiles on its own (slower than the whole program)
    new = jax.jit(lambda p, batch: module.loss(module.model.bind({"params": p}), batch))
    old = jax.jit(lambda p, batch: _old_loss(module.model, p, batch))
    for batch in batches:
        batch = jax.tree.map(jnp.asarray, batch)
        got = new(params, batch)
        got = got if isinstance(got, jax.Array) else got.mean
        assert float(got) == pytest.approx(float(old(params, batch)), rel=1e-5)


def test_a_transformers_llama_round_trips_through_scanned_layers(tmp_path):
    import torch
    import transformers

    config = transformers.LlamaConfig(**{k: v for k, v in LLAMA.items() if k != "model_type"}, attention_bias=True)
    hf = perturbed_transformers_model(config)
    hf.save_pretrained(tmp_path / "hf")
    with torch.no_grad():
        expected = hf(torch.from_numpy(TOKENS[:, :-1]).long()).logits.numpy()

    module = models.from_pretrained(tmp_path / "hf", scan_layers=True)
    trainer = quiet_trainer(strategy=fj.strategies.FSDP(fsdp=4, tensor=2, min_size_to_shard=0))
    trainer.validate(module, fj.DataLoader({"tokens": TOKENS}, batch_size=8), verbose=False)
    params = module.variables[0]
    assert params["layers"]["self_attn"]["q_proj"]["kernel"].shape == (2, 32, 32)  # [layers, in, out]
    apply = jax.jit(module.model.apply)  # one program for both weights (eagerly: each op compiled alone)
    logits = lambda: np.asarray(apply({"params": module.variables[0]}, TOKENS[:, :-1]))  # noqa: E731
    np.testing.assert_allclose(logits(), expected, atol=1e-4, rtol=0)

    noise = np.random.default_rng(1)
    changed = jax.tree.map(lambda p: p + 0.05 * noise.normal(size=p.shape).astype(p.dtype), params)
    fj.module.set_variables(module, changed, module.variables[1])
    models.save_pretrained(module, tmp_path / "out")
    back, info = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    with torch.no_grad():
        np.testing.assert_allclose(back.eval()(torch.from_numpy(TOKENS[:, :-1]).long()).logits.numpy(), logits(),
                                   atol=1e-4, rtol=0)
