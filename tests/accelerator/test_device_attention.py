"""`fj.nn.attention`'s fused kernel against its plain path, outputs and gradients, on the device
JAX finds first; `fj.nn.chunked_cross_entropy` there against the plain loss in float32 on CPU. On a TPU the kernel is the compiled Pallas splash kernel, for GPT-2's head_dim
(64) and Llama's (128), with and without a local window and soft cap; elsewhere it runs in
Pallas' interpreter (slow: one case, the one every model fitjax ships meets: causal, packed
segments, grouped-query heads). Both paths run on the device in float32: on a TPU its matrix
unit multiplies float32 in bf16 passes by default, hence `TOLERANCE` there."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fitjax as fj

ON_TPU = jax.default_backend() == "tpu"
TOLERANCE = 2e-2 if ON_TPU else 1e-4

CASES = [dict(head_dim=64), dict(head_dim=128), dict(head_dim=64, sliding_window=100, logit_softcap=20.0)]
# interpreted off TPU: 10-40 s on 2 busy CPU cores (`-k 'not slow_on_cpu'` leaves it out)
PARAMS = ([pytest.param(case) for case in CASES] if ON_TPU
          else [pytest.param(CASES[0], marks=pytest.mark.slow_on_cpu)])


@pytest.mark.parametrize("case", PARAMS, ids=lambda case: "-".join(map(str, case.values())))
def test_the_kernel_computes_the_plain_paths_outputs_and_gradients(case):
    case = dict(case)
    head_dim = case.pop("head_dim")
    keys = jax.random.split(jax.random.key(0), 4)
    # 2 rows of 256 positions (2 kernel blocks of 128 when interpreted), 4 query heads on 2 key heads
    q = jax.random.normal(keys[0], (2, 256, 4, head_dim))
    k, v = (jax.random.normal(key, (2, 256, 2, head_dim)) for key in keys[1:3])
    # packed rows: documents of 100 and 150 tokens then padding (id 0); one document
    segments = jnp.asarray([[1] * 100 + [2] * 150 + [0] * 6, [1] * 256])
    cotangent = jax.random.normal(keys[3], q.shape)

    def outputs_and_grads(implementation):
        def attend(q, k, v):
            return fj.nn.attention(q, k, v, segment_ids=segments, implementation=implementation, **case)

        out, pullback = jax.vjp(attend, q, k, v)
        return out, pullback(cotangent)

    kernel = jax.jit(lambda: outputs_and_grads("pallas"))()
    plain = jax.jit(lambda: outputs_and_grads("xla"))()
    for got, want in zip(jax.tree.leaves(kernel), jax.tree.leaves(plain), strict=True):
        np.testing.assert_allclose(got, want, atol=TOLERANCE * max(1.0, float(np.abs(want).max())))


@pytest.mark.skipif(not ON_TPU, reason="the kernel is chosen on a TPU only")
def test_auto_picks_the_kernel_on_a_tpu():
    q = jnp.ones((1, 128, 2, 64), jnp.bfloat16)
    text = jax.jit(lambda q: fj.nn.attention(q, q, q)).lower(q).as_text()
    assert "tpu_custom_call" in text


def test_the_chunked_loss_in_bf16_on_the_device_follows_the_plain_float32_loss_on_cpu():
    keys = jax.random.split(jax.random.key(0), 3)
    hidden = jax.random.normal(keys[0], (4, 256, 64))
    embedding = 0.1 * jax.random.normal(keys[1], (1000, 64))
    targets = jax.random.randint(keys[2], (4, 256), 0, 1000)

    def plain(hidden, embedding):
        logits = hidden @ embedding.T
        return optax.softmax_cross_entropy_with_integer_labels(logits, targets).sum()

    def chunked(hidden, embedding):
        low = hidden.astype(jnp.bfloat16), embedding.astype(jnp.bfloat16)
        return fj.nn.chunked_cross_entropy(*low, targets, chunk_size=64).sum

    on_cpu = jax.device_put((hidden, embedding), jax.devices("cpu")[0])
    want = jax.jit(jax.value_and_grad(plain, argnums=(0, 1)))(*on_cpu)
    got = jax.jit(jax.value_and_grad(chunked, argnums=(0, 1)))(hidden, embedding)
    assert float(got[0]) == pytest.approx(float(want[0]), rel=1e-2)
    for g, w in zip(got[1], want[1]):  # gradients as a whole, to bf16's precision
        g, w = np.asarray(g, np.float32), np.asarray(w)
        assert np.linalg.norm(g - w) <= 2e-2 * np.linalg.norm(w)
