"""`fj.nn.chunked_cross_entropy`: the plain output layer's loss and gradients, without its logits."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import fitjax as fj


def _inputs(batch=3, length=10, width=16, vocab=50, seed=0):
    keys = jax.random.split(jax.random.key(seed), 4)
    hidden = jax.random.normal(keys[0], (batch, length, width))
    embedding = jax.random.normal(keys[1], (vocab, width))
    targets = jax.random.randint(keys[2], (batch, length), 0, vocab)
    mask = (jax.random.uniform(keys[3], (batch, length)) > 0.3).astype(jnp.float32)
    return hidden, embedding, targets, mask


def _plain(hidden, embedding, targets, mask, softcap=None):
    logits = hidden @ embedding.T
    if softcap is not None:
        logits = softcap * jnp.tanh(logits / softcap)
    return (optax.softmax_cross_entropy_with_integer_labels(logits, targets) * mask).sum()


@pytest.mark.parametrize("softcap", [None, 5.0])
def test_loss_and_gradients_equal_the_plain_output_layers(softcap):
    hidden, embedding, targets, mask = _inputs()

    def chunked(hidden, embedding):  # 10 positions in chunks of 3: the last one padded
        return fj.nn.chunked_cross_entropy(hidden, embedding, targets, mask=mask, chunk_size=3,
                                           logit_softcap=softcap).sum

    np.testing.assert_allclose(chunked(hidden, embedding), _plain(hidden, embedding, targets, mask, softcap),
                               rtol=1e-6)
    got = jax.jit(jax.grad(chunked, argnums=(0, 1)))(hidden, embedding)
    want = jax.grad(_plain, argnums=(0, 1))(hidden, embedding, targets, mask, softcap)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=1e-5)


def test_the_count_and_mean_are_over_the_masked_tokens():
    hidden, embedding, targets, mask = _inputs()
    loss = fj.nn.chunked_cross_entropy(hidden, embedding, targets, mask=mask, chunk_size=4)
    assert float(loss.count) == float(mask.sum())
    np.testing.assert_allclose(loss.mean, _plain(hidden, embedding, targets, mask) / mask.sum(), rtol=1e-6)
    every = fj.nn.chunked_cross_entropy(hidden, embedding, targets)
    assert float(every.count) == targets.size


def test_bfloat16_inputs_give_the_plain_bfloat16_gradients():
    hidden, embedding, targets, mask = (a.astype(jnp.bfloat16) if a.dtype == jnp.float32 else a for a in _inputs())
    got = jax.grad(lambda h, e: fj.nn.chunked_cross_entropy(h, e, targets, mask=mask, chunk_size=5).sum,
                   argnums=(0, 1))(hidden, embedding)
    want = jax.grad(lambda h, e: _plain(h, e, targets, mask), argnums=(0, 1))(hidden, embedding)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype == jnp.bfloat16
        np.testing.assert_allclose(g.astype(np.float32), w.astype(np.float32), atol=2e-2, rtol=2e-2)


def test_the_train_steps_scratch_holds_one_chunks_logits_not_all():
    """The compiled gradient's temporaries: the plain loss keeps [tokens, vocab] float32 logits
    (16 MiB here) and their gradient; the chunked one a chunk's (1 MiB) and the small arrays."""
    tokens, width, vocab = 4096, 32, 1024
    hidden = jax.ShapeDtypeStruct((4, tokens // 4, width), jnp.float32)
    embedding = jax.ShapeDtypeStruct((vocab, width), jnp.float32)
    targets = jnp.zeros((4, tokens // 4), jnp.int32)
    mask = jnp.ones((4, tokens // 4))

    def temp_bytes(loss):
        compiled = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(hidden, embedding).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    plain = temp_bytes(lambda h, e: _plain(h, e, targets, mask))
    chunked = temp_bytes(lambda h, e: fj.nn.chunked_cross_entropy(h, e, targets, chunk_size=64).sum)
    logits = tokens * vocab * 4
    assert plain >= logits
    assert chunked < logits / 4


@pytest.mark.parametrize("arguments, match", [
    (dict(embedding=jnp.ones((16, 50))), r"embedding \[vocab, width\]"),
    (dict(mask=jnp.ones((3, 9))), "mask=...*targets' shape"),
    (dict(chunk_size=0), "chunk_size=0"),
])
def test_bad_arguments_say_what_is_expected(arguments, match):
    hidden, embedding, targets, _ = _inputs(width=8)
    arguments = {"embedding": jnp.ones((50, 8)), **arguments}
    embedding = arguments.pop("embedding")
    with pytest.raises(ValueError, match=match):
        fj.nn.chunked_cross_entropy(hidden, embedding, targets, **arguments)


@pytest.mark.parametrize("axes, hidden_spec, embedding_spec", [
    (("data", "fsdp"), P(("data", "fsdp")), P("fsdp")),                 # FSDP with data parallel
    (("fsdp", "tensor"), P("fsdp", None, "tensor"), P("fsdp", "tensor")),  # tensor: the batch whole over it
], ids=["data-x-fsdp", "fsdp-x-tensor"])
def test_under_a_batch_sharded_mesh_the_loop_runs_per_device_and_equals_one_device(axes, hidden_spec, embedding_spec):
    """Under a mesh whose batch axes hold several devices the chunk loop runs inside `shard_map`
    (each device its own rows, the embedding whole); loss and gradients equal one device's. A
    batch the axes do not divide takes the partitioner's way, also exact."""
    hidden, embedding, targets, mask = _inputs(batch=8, vocab=48)

    def loss(hidden, embedding, targets, mask):
        return fj.nn.chunked_cross_entropy(hidden, embedding, targets, mask=mask, chunk_size=3, logit_softcap=5.0).sum

    want = jax.value_and_grad(loss, argnums=(0, 1))(hidden, embedding, targets, mask)
    mesh = jax.make_mesh((4, 2) if axes[0] == "fsdp" else (2, 4), axes,
                         axis_types=(jax.sharding.AxisType.Auto,) * 2)
    with jax.set_mesh(mesh):
        assert "shard_map" in str(jax.make_jaxpr(loss)(hidden, embedding, targets, mask))
        assert "shard_map" not in str(jax.make_jaxpr(loss)(hidden[:3], embedding, targets[:3], mask[:3]))
        sharded = (jax.device_put(hidden, NamedSharding(mesh, hidden_spec)),
                   jax.device_put(embedding, NamedSharding(mesh, embedding_spec)))
        got = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(*sharded, targets, mask)
        odd = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(hidden[:3], embedding, targets[:3], mask[:3])
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(g, w, atol=1e-5, rtol=1e-5)
    odd_want = jax.value_and_grad(loss, argnums=(0, 1))(hidden[:3], embedding, targets[:3], mask[:3])
    for g, w in zip(jax.tree.leaves(odd), jax.tree.leaves(odd_want)):
        np.testing.assert_allclose(g, w, atol=1e-5, rtol=1e-5)


def test_bfloat16_under_a_mesh_the_loop_splits_in_part_compiles_and_equals_one_device():
    """A `shard_map` manual over `fsdp` only (`tensor` stays XLA's) with a bfloat16 embedding:
    its gradient's `psum` aborted XLA:CPU's compile (`_cross_entropy._psum`); on CPU it is summed
    in float32, on TPU in bfloat16 (half the bytes)."""
    hidden, embedding, targets, mask = (a.astype(jnp.bfloat16) if a.dtype == jnp.float32 else a
                                        for a in _inputs(batch=4, vocab=48))

    def loss(hidden, embedding):
        return fj.nn.chunked_cross_entropy(hidden, embedding, targets, mask=mask, chunk_size=5).sum

    want = jax.value_and_grad(loss, argnums=(0, 1))(hidden, embedding)
    mesh = jax.make_mesh((2, 1), ("fsdp", "tensor"), axis_types=(jax.sharding.AxisType.Auto,) * 2,
                         devices=jax.devices()[:2])
    step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
    with jax.set_mesh(mesh):
        got = step(jax.device_put(hidden, NamedSharding(mesh, P("fsdp"))), embedding)
        summed = {platform: sorted(re.findall(r'"stablehlo\.all_reduce"\(.*?\}\) : \((tensor<[^>]+>)\)',
                                              step.trace(hidden, embedding).lower(lowering_platforms=(platform,))
                                              .as_text(), re.S))
                  for platform in ("cpu", "tpu")}
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert g.dtype == w.dtype
        np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(w, np.float32), atol=2e-2, rtol=2e-2)
    # the embedding's gradient [vocab, width] and the loss
    assert summed == {"cpu": ["tensor<48x16xf32>", "tensor<f32>"], "tpu": ["tensor<48x16xbf16>", "tensor<f32>"]}
