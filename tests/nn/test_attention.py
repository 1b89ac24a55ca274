"""`fj.nn.attention`: the masks a user relies on, against a per-example loop written with numpy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fitjax as fj


def _reference(q, k, v, allowed, scale=None, softcap=None):
    """One query at a time in float64: softmax over the keys it may see."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    batch, q_len, heads, dim = q.shape
    groups = heads // k.shape[2]
    out = np.zeros_like(q)
    scale = dim ** -0.5 if scale is None else scale
    for b in range(batch):
        for h in range(heads):
            for i in range(q_len):
                s = k[b, :, h // groups] @ q[b, i, h] * scale
                if softcap:
                    s = softcap * np.tanh(s / softcap)
                s = np.where(allowed[b, i], s, -np.inf)
                w = np.exp(s - s.max())
                out[b, i, h] = (w / w.sum()) @ v[b, :, h // groups]
    return out


def _qkv(batch=2, q_len=8, kv_len=8, heads=4, kv_heads=2, dim=16, seed=0):
    keys = jax.random.split(jax.random.key(seed), 3)
    return (jax.random.normal(keys[0], (batch, q_len, heads, dim)),
            jax.random.normal(keys[1], (batch, kv_len, kv_heads, dim)),
            jax.random.normal(keys[2], (batch, kv_len, kv_heads, dim)))


def test_causal_grouped_query_attention_matches_the_loop():
    q, k, v = _qkv()
    allowed = np.tril(np.ones((8, 8), bool))[None].repeat(2, 0)
    np.testing.assert_allclose(fj.nn.attention(q, k, v, implementation="xla"), _reference(q, k, v, allowed),
                               atol=1e-5)


def test_packed_segments_never_see_each_other():
    q, k, v = _qkv()
    segments = jnp.array([[1, 1, 1, 2, 2, 2, 2, 0], [1, 1, 1, 1, 1, 2, 2, 2]])
    ids = np.asarray(segments)
    allowed = np.tril(np.ones((8, 8), bool))[None] & (ids[:, :, None] == ids[:, None, :])
    out = fj.nn.attention(q, k, v, segment_ids=segments)
    np.testing.assert_allclose(out, _reference(q, k, v, allowed), atol=1e-5)
    # the second document alone, unpacked, gives the same rows
    alone = fj.nn.attention(q[:1, 3:7], k[:1, 3:7], v[:1, 3:7])
    np.testing.assert_allclose(out[:1, 3:7], alone, atol=1e-5)


def test_sliding_window_softcap_and_scale():
    q, k, v = _qkv(kv_heads=4)
    i = np.arange(8)
    allowed = ((i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < 3))[None].repeat(2, 0)
    out = fj.nn.attention(q, k, v, sliding_window=3, logit_softcap=5.0, scale=0.3)
    np.testing.assert_allclose(out, _reference(q, k, v, allowed, scale=0.3, softcap=5.0), atol=1e-5)


def test_a_query_chunk_in_a_cache_buffer_sees_only_filled_earlier_slots():
    q, k, v = _qkv(q_len=1, kv_len=8)
    # one new token at position 4 of an 8-slot cache: slots 5-7 are unfilled
    positions = (jnp.full((2, 1), 4), jnp.broadcast_to(jnp.arange(8), (2, 8)))
    out = fj.nn.attention(q, k, v, positions=positions)
    full_q = jnp.zeros((2, 5, 4, 16)).at[:, 4].set(q[:, 0])
    prefix = fj.nn.attention(full_q, k[:, :5], v[:, :5])
    np.testing.assert_allclose(out[:, 0], prefix[:, 4], atol=1e-5)


def test_a_fully_masked_padding_query_stays_finite_with_finite_gradients():
    q, k, v = _qkv()
    segments = (jnp.zeros((2, 8), int).at[:, -1].set(9), jnp.zeros((2, 8), int))
    grads = jax.grad(lambda q: fj.nn.attention(q, k, v, segment_ids=segments).sum())(q)
    assert np.isfinite(np.asarray(grads)).all()


@pytest.mark.parametrize("bad, match", [
    (dict(implementation="flash"), "implementation='flash'"),
    (dict(shape=(2, 8, 3, 16)), "multiple of the key's"),
])
def test_bad_arguments_name_what_is_allowed(bad, match):
    q, k, v = _qkv()
    if "shape" in bad:
        q = jnp.ones(bad["shape"])
    with pytest.raises(ValueError, match=match):
        fj.nn.attention(q, k, v, **{key: value for key, value in bad.items() if key != "shape"})


def test_auto_on_this_platform_is_the_plain_path_unless_a_kernel_applies():
    q, k, v = _qkv()
    segments = jnp.array([[1, 1, 1, 2, 2, 2, 2, 0], [1, 1, 1, 1, 1, 2, 2, 2]])
    auto = fj.nn.attention(q, k, v, segment_ids=segments)
    plain = fj.nn.attention(q, k, v, segment_ids=segments, implementation="xla")
    if jax.default_backend() == "cpu":  # no kernel here: the same program, the same bits
        np.testing.assert_array_equal(auto, plain)
    else:
        np.testing.assert_allclose(auto, plain, atol=2e-2)


@pytest.mark.parametrize("arguments, match", [
    (dict(positions=(jnp.zeros((2, 128), int), jnp.zeros((2, 128), int))), "positions"),
    (dict(segment_ids=(jnp.zeros((2, 128), int), jnp.ones((2, 128), int))), "pair of segment_ids"),
    (dict(length=100), "multiples of 128"),
])
def test_the_tpu_kernel_says_which_argument_it_cannot_take(arguments, match):
    q, k, v = _qkv(q_len=arguments.pop("length", 128), kv_len=128, dim=64)
    with pytest.raises(ValueError, match=match):
        fj.nn.attention(q, k, v, implementation="pallas", **arguments)


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="cuDNN may run on a GPU")
def test_cudnn_off_a_cuda_gpu_says_what_it_needs():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="runs on a CUDA GPU"):
        fj.nn.attention(q, k, v, implementation="cudnn")


def test_the_tpu_kernel_lowers_for_a_tpu_at_gpt2s_shape():
    """Exported for a TPU from any host: the kernel's Mosaic program for GPT-2 small's attention
    (head_dim 64, 1024 tokens, packed segments), forward and backward."""
    from fitjax.nn._splash import splash_attention
    from fitjax.nn._kernels import splash_blocks

    qkv = jax.ShapeDtypeStruct((2, 1024, 12, 64), jnp.bfloat16)
    segments = jax.ShapeDtypeStruct((2, 1024), jnp.int32)

    def loss(q, k, v, ids):
        out = splash_attention(q, k, v, causal=True, segment_ids=ids, sliding_window=None, logit_softcap=None,
                               scale=None, blocks=splash_blocks(1024, 1024, 64), interpret=False)
        return out.astype(jnp.float32).sum()

    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    text = jax.export.export(grads, platforms=["tpu"])(qkv, qkv, qkv, segments).mlir_module()
    assert text.count("tpu_custom_call") == 3  # the forward, dq and dkv kernels; no plain scores


def test_a_strategys_program_for_a_tpu_traces_the_tpu_kernel_on_any_machine():
    """`fitjax plan --target tpu-...` compiles on a CPU machine for a TPU it does not have:
    `implementation="auto"` inside a strategy's program follows the program's devices (the splash
    kernel, as the chip runs it), not the process's backend; outside one, the process's choice."""
    from fitjax.step import xla_tpu

    strategy = fj.strategies.SingleDevice()
    strategy.setup(list(xla_tpu.deviceless_topology("v5e:1x1").devices))
    assert strategy.platform == "tpu"
    q = jax.ShapeDtypeStruct((1, 256, 2, 64), jnp.bfloat16, sharding=strategy.replicated)
    for_tpu = strategy.jit(lambda q: fj.nn.attention(q, q, q), in_shardings=strategy.replicated,
                           out_shardings=strategy.replicated)
    assert "tpu_custom_call" in for_tpu.lower(q).as_text()
    here = jax.jit(lambda q: fj.nn.attention(q, q, q)).lower(jnp.zeros((1, 256, 2, 64), jnp.bfloat16))
    assert "tpu_custom_call" not in here.as_text()
