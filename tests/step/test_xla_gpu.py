"""On GPU the state's initialisation lowers threefry to JAX's GPU kernel (it compiled 13.6x faster
for GPT-2 small on an H200, `benchmarks/init_compile.py`); nothing else changes. Checked here by
exporting a draw for CUDA from this CPU machine."""

from __future__ import annotations

import jax
import pytest

from fitjax.step import xla_gpu


def _cuda_text() -> str:
    draw = jax.jit(lambda key: jax.random.normal(key, (4, 3)))
    return jax.export.export(draw, platforms=["cuda"])(jax.random.key(0)).mlir_module()


def test_on_gpu_the_draws_lower_to_the_kernel_and_only_while_entered():
    assert "custom_call @cu_threefry2x32" not in _cuda_text()  # JAX's default: XLA operations
    with xla_gpu.rng_kernels("gpu"):
        assert "custom_call @cu_threefry2x32" in _cuda_text()
    assert "custom_call @cu_threefry2x32" not in _cuda_text()  # the user's setting is back


@pytest.mark.parametrize("platform", ["cpu", "tpu"])
def test_other_platforms_lower_as_before(platform):
    with xla_gpu.rng_kernels(platform):
        assert "custom_call @cu_threefry2x32" not in _cuda_text()


def test_a_users_own_choice_stands():
    jax.config.update("jax_threefry_gpu_kernel_lowering", True)
    try:
        with xla_gpu.rng_kernels("cpu"):
            assert "custom_call @cu_threefry2x32" in _cuda_text()
        assert jax.config.jax_threefry_gpu_kernel_lowering
    finally:
        jax.config.update("jax_threefry_gpu_kernel_lowering", False)
