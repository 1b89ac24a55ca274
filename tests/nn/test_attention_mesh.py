"""`fj.nn.attention`'s TPU kernel split over a mesh (`fitjax.nn._splash`): inside a strategy's
program it runs in `shard_map` (batch over data/fsdp, heads over tensor) and equals one device;
it traces under `nn.scan` and remat; where the mesh cannot split it, the plain path, said once.
The kernel runs in Pallas' interpreter on these 8 CPU devices (tiny shapes: it is slow)."""

import logging

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_trees_close

import fitjax as fj
from fitjax.planner._hlo import collectives


def _inputs(batch, heads, kv_heads, length=128, dim=64):
    keys = jax.random.split(jax.random.key(1), 3)
    q = jax.random.normal(keys[0], (batch, length, heads, dim))
    k, v = (jax.random.normal(key, (batch, length, kv_heads, dim)) for key in keys[1:])
    ids = jnp.asarray(np.repeat(np.arange(batch)[:, None] % 2 + (np.arange(length) >= 80), 1, 0) + 1, jnp.int32)
    return q, k, v, ids


def _attention(q, k, v, ids):
    return fj.nn.attention(q, k, v, segment_ids=ids, implementation="pallas")


def _with_gradients(q, k, v, ids):  # the output and its inputs' gradients for cotangent cos(out)
    out, vjp = jax.vjp(lambda q, k, v: _attention(q, k, v, ids), q, k, v)
    return out, vjp(jnp.cos(out))


@pytest.mark.parametrize("strategy, heads, kv_heads", [
    (lambda: fj.strategies.DataParallel(), 2, 1),                      # batch over data
    (lambda: fj.strategies.FSDP(data=2, fsdp=2, tensor=2), 4, 2),     # kv heads split over tensor
    (lambda: fj.strategies.FSDP(fsdp=4, tensor=2), 2, 1),             # kv heads repeated for tensor
], ids=["dp", "data-fsdp-tensor-split-kv", "fsdp-tensor-repeated-kv"])
def test_the_kernel_over_a_mesh_equals_one_device_and_moves_nothing(strategy, heads, kv_heads):
    strategy = strategy()
    strategy.setup(jax.devices())
    q, k, v, ids = _inputs(8 if isinstance(strategy, fj.strategies.DataParallel) else 4, heads, kv_heads)
    tensor = "tensor" if "tensor" in strategy.mesh.axis_names else None

    def laid_out(*spec):
        return jax.sharding.NamedSharding(strategy.mesh, jax.sharding.PartitionSpec(strategy.data_axes, *spec))

    heads_split = laid_out(None, tensor, None)
    kv = heads_split if tensor is None or kv_heads % 2 == 0 else laid_out()  # repeated: kept whole
    shardings = (heads_split, kv, kv, laid_out())
    one = jax.jit(_with_gradients)(q, k, v, ids)
    program = strategy.jit(_with_gradients, in_shardings=shardings, out_shardings=(heads_split, shardings[:3]))
    assert_trees_close(program(q, k, v, ids), one, rtol=1e-5, atol=1e-5)
    # each device attends with its own examples' heads: the forward moves nothing between devices
    forward = strategy.jit(_attention, in_shardings=shardings, out_shardings=heads_split)
    assert collectives(forward.lower(q, k, v, ids).compile().as_text(), 8) == {}


class _Layer(nn.Module):
    implementation: str

    @nn.compact
    def __call__(self, x, _):
        qkv = nn.Dense(3 * 2 * 64, use_bias=False)(x).reshape(*x.shape[:2], 3, 2, 64)
        out = fj.nn.attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], implementation=self.implementation)
        return x + out.reshape(x.shape), None


class _Stack(nn.Module):
    implementation: str

    @nn.compact
    def __call__(self, x):
        layers = nn.scan(nn.remat(_Layer), variable_axes={"params": 0}, split_rngs={"params": True}, length=2)
        return layers(self.implementation)(x, None)[0]


def test_the_kernel_traces_under_scan_and_remat_and_matches_the_plain_path():
    x = jax.random.normal(jax.random.key(0), (4, 128, 128))
    params = _Stack("xla").init(jax.random.key(1), x)

    def loss(params, x, implementation):
        return (_Stack(implementation).apply(params, x) ** 2).mean()

    plain = jax.jit(jax.value_and_grad(loss), static_argnums=2)(params, x, "xla")
    strategy = fj.strategies.FSDP(fsdp=4, tensor=2)
    strategy.setup(jax.devices())
    kernel = strategy.jit(jax.value_and_grad(lambda p, x: loss(p, x, "pallas")),
                          in_shardings=(strategy.replicated, strategy.batch_sharding),
                          out_shardings=strategy.replicated)(params, x)
    assert_trees_close(kernel, plain, rtol=1e-5, atol=1e-5)


def test_a_mesh_the_kernel_cannot_split_runs_the_plain_path_and_says_so_once(caplog):
    q, k, v, ids = _inputs(batch=2, heads=2, kv_heads=1)  # 2 rows over fsdp=4
    strategy = fj.strategies.FSDP(fsdp=4, tensor=2)
    strategy.setup(jax.devices())
    caplog.set_level(logging.WARNING, logger="fitjax")
    logging.getLogger("fitjax").addHandler(caplog.handler)
    try:
        for _ in range(2):
            out = strategy.jit(lambda q, k, v, ids: fj.nn.attention(q, k, v, segment_ids=ids, implementation="pallas"),
                               in_shardings=strategy.replicated, out_shardings=strategy.replicated)(q, k, v, ids)
    finally:
        logging.getLogger("fitjax").removeHandler(caplog.handler)
    said = [r.getMessage() for r in caplog.records if "plain path" in r.getMessage()]
    assert said == ["fj.nn.attention runs the plain path instead of the TPU kernel: a batch of 2 rows does not "
                    "divide over the mesh's fsdp axes (4 devices)"]
    np.testing.assert_allclose(out, fj.nn.attention(q, k, v, segment_ids=ids, implementation="xla"), atol=1e-5)
