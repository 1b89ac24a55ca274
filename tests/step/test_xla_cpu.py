"""On CPU, a step with a large scratch is compiled with it split into heaps malloc reuses, or,
where a buffer is too large for that, without donation when its scratch dwarfs its state."""

from __future__ import annotations

import flax.linen as nn
import jax
import numpy as np
import optax
import pytest
from helpers import assert_trees_close, count_compiles, quiet_trainer, regression_data

import fitjax as fj
from fitjax import _bootstrap, _jax_compat
from fitjax.step import xla_cpu as _xla_cpu
from fitjax.step.xla_cpu import Plan

MiB = 1 << 20


@pytest.mark.parametrize("platform, temp, buffer, state, leaf, expected", [
    ("cpu", 1 * MiB, 1 * MiB, 3 * MiB, 1 * MiB, Plan()),  # MNIST-sized MLP: small scratch
    ("cpu", 135 * MiB, 12 * MiB, 10 * MiB, 3 * MiB, Plan(heap_bytes=16 * MiB)),  # the small CNN
    ("cpu", 135 * MiB, 24 * MiB, 10 * MiB, 3 * MiB, Plan(heap_bytes=24 * MiB)),  # a heap per buffer
    # a buffer too large for any heap under glibc's mmap threshold: donation decides
    ("cpu", 135 * MiB, 32 * MiB, 10 * MiB, 3 * MiB, Plan(donate=False)),  # scratch faulted per step
    ("cpu", 135 * MiB, 32 * MiB, 40 * MiB, 3 * MiB, Plan()),  # not donating: +30% memory
    ("cpu", 135 * MiB, 32 * MiB, 30 * MiB, 32 * MiB, Plan()),  # an undonated output that large is faulted too
    ("gpu", 135 * MiB, 32 * MiB, 10 * MiB, 3 * MiB, Plan()),  # only XLA:CPU mallocs its scratch per call
])
def test_plan(platform, temp, buffer, state, leaf, expected):
    assert _xla_cpu.plan(platform=platform, temp_bytes=temp, largest_buffer_bytes=buffer,
                             state_bytes=state, largest_leaf_bytes=leaf) == expected


def test_plan_compiler_options():
    assert Plan().compiler_options is None
    assert Plan(heap_bytes=16 * MiB).compiler_options == {"xla_multiheap_size_constraint_per_heap": 16 * MiB}


def test_compiler_options_ask_for_llvm_level_2_on_cpu_only(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    level = {"xla_backend_optimization_level": 2}
    assert _xla_cpu.compiler_options("cpu") == level
    assert _xla_cpu.compiler_options("cpu", {"xla_multiheap_size_constraint_per_heap": 16 * MiB}) == {
        **level, "xla_multiheap_size_constraint_per_heap": 16 * MiB}
    assert _xla_cpu.compiler_options("cpu", {"xla_backend_optimization_level": 3}) == {
        "xla_backend_optimization_level": 3}  # a level asked for stands
    assert _xla_cpu.compiler_options("gpu") is None and _xla_cpu.compiler_options("tpu", {"a": 1}) == {"a": 1}
    monkeypatch.setenv("XLA_FLAGS", "--xla_backend_optimization_level=3")  # the user's own choice
    assert _xla_cpu.compiler_options("cpu") is None


def _compile_levels(monkeypatch) -> list:
    """The LLVM level asked for by each XLA compilation from here on (None: XLA's default)."""
    from jax._src import compiler

    levels, real = [], compiler.get_compile_options

    def recording(*args, env_options_overrides=None, **kwargs):
        levels.append((env_options_overrides or {}).get("xla_backend_optimization_level"))
        return real(*args, env_options_overrides=env_options_overrides, **kwargs)

    monkeypatch.setattr(compiler, "get_compile_options", recording)
    return levels


@pytest.mark.parametrize("flag", [None, "--xla_backend_optimization_level=3"])
def test_a_fits_programs_compile_at_level_2_unless_the_user_named_a_level(monkeypatch, flag):
    if flag is not None:
        monkeypatch.setenv("XLA_FLAGS", f"{flag} --xla_force_host_platform_device_count=8")
    levels = _compile_levels(monkeypatch)
    data = regression_data(n=128, d=8)
    trainer = quiet_trainer(max_epochs=1, seed=0, strategy="single")
    with count_compiles() as compiles:
        trainer.fit(WideRegressor(nn.Dense(1)), fj.DataLoader(data, batch_size=32),
                    fj.DataLoader(data, batch_size=32))
    programs = compiles["init"] + compiles["train_step"] + compiles["eval_step"]
    assert programs >= 3
    # every program fitjax jits (the data's gathers too: `fitjax.step.compiling.jit`; JAX's own, such
    # as a key's, ask for nothing), or none when the user named a level
    asked = [level for level in levels if level is not None]
    assert asked == [] if flag else asked == [2] * len(asked) and len(asked) >= programs


def test_largest_buffer_bytes_reads_hlo_shapes():
    hlo = """
    ENTRY %main (p0: f32[128,28,28,32], p1: bf16[4096,2048]) -> (f32[], pred[10]) {
      %c = c64[3,3]{1,0} constant(...)
      %f = f8e4m3fn[64]{0} parameter(2)
      %t = (s32[802816,4]{1,0}, u8[7]{0}) tuple(...)
    }"""
    assert _xla_cpu.largest_buffer_bytes(hlo) == 4096 * 2048 * 2  # the bf16 parameter
    assert _xla_cpu.largest_buffer_bytes(hlo.replace("bf16[4096,2048]", "u8[2]")) == 128 * 28 * 28 * 32 * 4
    assert _xla_cpu.largest_buffer_bytes("%t = (s32[802816,4]{1,0}, pred[]) tuple()") == 802816 * 16
    assert _xla_cpu.largest_buffer_bytes("%p = pred[1000]{0} compare()") == 1000
    assert _xla_cpu.largest_buffer_bytes("%s = f32[] constant(0)") == 4


class Wide(nn.Module):
    """2048 hidden units: over batches of 4096, 32 MiB activations and 64 MiB of scratch per
    step; over batches of 3072, 24 MiB activations and 48 MiB of scratch. 70 KiB of state."""

    @nn.compact
    def __call__(self, x):
        return nn.Dense(1)(nn.relu(nn.Dense(2048)(x)))


class WideRegressor(fj.LitModule):
    def __init__(self, width_model: nn.Module):
        super().__init__()
        self.model = width_model

    def loss(self, model, batch):
        return ((model(batch["x"]) - batch["y"]) ** 2).mean()

    def configure_optimizer(self):
        return optax.adam(1e-3)


class DonationSeen(fj.Callback):
    """Whether the state a step was given was donated (its buffers deleted) by that step."""

    def __init__(self):
        self.donated = []

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self._before = jax.tree.leaves(trainer.state.params)

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.donated.append(all(leaf.is_deleted() for leaf in self._before))


def _fit(model: nn.Module, data, batch_size: int, **kwargs):
    seen = DonationSeen()
    module = WideRegressor(model)
    trainer = quiet_trainer(max_epochs=2, callbacks=[seen], seed=0, strategy="single", **kwargs)
    with count_compiles() as compiles:
        trainer.fit(module, fj.DataLoader(data, batch_size=batch_size))
    return module, seen.donated, compiles


def test_large_scratch_in_small_buffers_is_split_into_heaps_and_donated(monkeypatch):
    data = regression_data(n=4 * 3072, d=8)
    module, donated, compiles = _fit(Wide(), data, 3072)
    assert donated == [True] * 8
    assert compiles["train_step"] == 2  # the program as jitted, measured once, and the one that runs
    # the same numbers as the step compiled with one scratch buffer
    monkeypatch.setattr(_xla_cpu, "plan", lambda **sizes: Plan())
    reference, donated, compiles = _fit(Wide(), data, 3072)
    assert donated == [True] * 8 and compiles["train_step"] == 2  # measured with heaps, then one scratch
    assert_trees_close(module.variables, reference.variables, rtol=0, atol=0)
    # a step whose plan is the heaps it was first compiled with (the small CNN's) compiles once
    monkeypatch.setattr(_xla_cpu, "plan", lambda **sizes: _xla_cpu._FIRST)
    first, donated, compiles = _fit(Wide(), data, 3072)
    assert donated == [True] * 8 and compiles["train_step"] == 1
    assert_trees_close(module.variables, first.variables, rtol=0, atol=0)


def test_large_scratch_in_large_buffers_small_state_is_not_donated_on_cpu(monkeypatch):
    data = regression_data(n=8192, d=8)
    module, donated, compiles = _fit(Wide(), data, 4096)
    assert donated == [False] * 4
    assert compiles["train_step"] == 2  # the donated program, measured once, and the one that runs
    # the same numbers as when the step donates: both compile the same computation
    monkeypatch.setattr(_xla_cpu, "plan", lambda **sizes: Plan())
    reference, donated, _ = _fit(Wide(), data, 4096)
    assert donated == [True] * 4
    assert_trees_close(module.variables, reference.variables)


def test_small_step_is_donated():
    class Narrow(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(1)(nn.relu(nn.Dense(32)(x)))

    _, donated, compiles = _fit(Narrow(), regression_data(n=256, d=8), 64)
    assert donated == [True] * 8
    assert compiles["train_step"] == 1


# --------------------------------------------------------------------- the scheduler flag

_CLIPPED_FIT = """
import hashlib, os, sys
import numpy as np, optax, flax.linen as nn
{before}
import fitjax as fj
import jax
import numpy as np

print(os.environ.get("XLA_FLAGS", ""), flush=True)
if not {fit}:
    sys.exit(0)

class Tiny(fj.LitModule):
    def __init__(self):
        super().__init__()
        self.model = nn.Sequential([nn.Dense(16), nn.relu, nn.Dense(1)])
    def loss(self, model, batch):
        return ((model(batch["x"]) - batch["y"]) ** 2).mean()
    def configure_optimizer(self):
        return optax.adam(1e-2)

rng = np.random.default_rng(0)
data = {{"x": rng.normal(size=(256, 8)).astype(np.float32), "y": rng.normal(size=(256, 1)).astype(np.float32)}}
module = Tiny()
fj.Trainer(max_epochs=2, gradient_clip_val=0.5, enable_progress_bar=False, enable_model_summary=False,
           logger=False, enable_checkpointing=False, strategy="single").fit(module, fj.DataLoader(data, batch_size=32))
leaves = [np.asarray(x).tobytes() for x in jax.tree.leaves(module.variables)]
print(hashlib.sha256(b"".join(leaves)).hexdigest())
"""


def _run(before: str = "", xla_flags: str | None = None, fit: bool = True) -> tuple[str, str | None]:
    """`XLA_FLAGS` after `import fitjax` in a fresh process, and the hash of a clipped fit's
    variables there (None with `fit=False`)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    if xla_flags is not None:
        env["XLA_FLAGS"] = xla_flags
    out = subprocess.run([sys.executable, "-c", _CLIPPED_FIT.format(before=before, fit=fit)], env=env,
                         capture_output=True, text=True, timeout=300, check=True).stdout.splitlines()
    # the fit's own lines (fitjax's banner) come between the flags and the hash
    return out[0], out[-1] if fit else None


def test_import_picks_the_depth_first_scheduler_and_results_are_the_same_bits():
    flags, ours = _run()  # a fresh process: `import fitjax` adds the flag
    assert flags == _bootstrap.SCHEDULER_FLAG
    # the user's own choice stands, and XLA's default scheduler gives the same bits (only the
    # order of operations changes)
    keep = "--xla_cpu_enable_concurrency_optimized_scheduler=true"
    flags, default = _run(xla_flags=keep)
    assert flags == keep and default == ours
    # backends already started before fitjax was imported: the flags are fixed, nothing is added
    flags, _ = _run(before="import jax; jax.devices()", fit=False)  # the flags are all it asks
    assert flags == ""


@pytest.mark.parametrize("version, added", [("0.10.2", True), ("0.6.0", True), ("0.11.0", False),
                                            ("1.0.0", False), ("0.11.0.dev20270101", False)])
def test_the_flag_is_set_only_for_jaxlib_releases_it_was_checked_with(monkeypatch, version, added):
    # XLA aborts the process on an unknown flag: an unchecked jaxlib keeps XLA's default
    import jaxlib

    monkeypatch.setattr(jaxlib, "__version__", version)
    monkeypatch.setattr(_jax_compat, "backends_started", lambda: False)
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    assert _bootstrap.prefer_depth_first_scheduler() is added
    import os

    assert (_bootstrap.SCHEDULER_FLAG in os.environ["XLA_FLAGS"]) is added


def _conv(x, k):
    return jax.lax.conv_general_dilated(x, k, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))


def test_short_loops_are_unrolled_on_cpu_only_for_steps_holding_a_convolution():
    x, k = jax.numpy.ones((2, 4, 4, 3)), jax.numpy.ones((3, 3, 3, 5))

    def nested(state, inputs):  # a convolution inside a rematerialized function inside a scan
        body = jax.checkpoint(lambda carry, xi: (carry + _conv(xi, state).sum(), None))
        return jax.lax.scan(body, 0.0, inputs)[0]

    def dense(state, inputs):
        return jax.lax.scan(lambda carry, xi: (carry + (xi @ state).sum(), None), 0.0, inputs)[0]

    stacked = jax.numpy.stack([x, x])
    assert _xla_cpu.unrolls_loops(platform="cpu", step_fn=nested, state=k, inputs=stacked, trips=2)
    assert not _xla_cpu.unrolls_loops(platform="cpu", step_fn=nested, state=k, inputs=stacked, trips=32)
    assert not _xla_cpu.unrolls_loops(platform="gpu", step_fn=nested, state=k, inputs=stacked, trips=2)
    assert not _xla_cpu.unrolls_loops(platform="cpu", step_fn=dense, state=jax.numpy.ones((4, 2)),
                                      inputs=jax.numpy.ones((2, 3, 4)), trips=2)


class SmallCNN(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(4, (3, 3))(x))
        return nn.Dense(1)(x.reshape(x.shape[0], -1))


def test_a_convolutional_step_accumulating_on_cpu_is_unrolled_and_equals_one_big_batch(monkeypatch):
    """The digits CNN's epoch took 9.5x as long with accumulation (a convolution's gradient in a
    loop body); unrolled, the step computes the same: 2 micro-batches of 8 equal one batch of 16."""
    decisions = []
    real = _xla_cpu.unrolls_loops
    monkeypatch.setattr(_xla_cpu, "unrolls_loops", lambda **kw: decisions.append(real(**kw)) or decisions[-1])
    rng = np.random.default_rng(0)
    data = {"x": rng.normal(size=(64, 6, 6, 2)).astype(np.float32), "y": rng.normal(size=(64, 1)).astype(np.float32)}
    fitted = []
    for batch_size, k in ((16, 1), (8, 2)):
        module = WideRegressor(SmallCNN())
        trainer = quiet_trainer(max_epochs=2, seed=0, strategy="single", accumulate_grad_batches=k)
        trainer.fit(module, fj.DataLoader(data, batch_size=batch_size))
        fitted.append(trainer.state.params)
    assert decisions == [True]  # asked once: the accumulating fit (no loop in the other)
    assert_trees_close(fitted[1], fitted[0], rtol=1e-5, atol=1e-6)
