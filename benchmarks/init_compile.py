"""A model's initialisation compiled with threefry lowered two ways: XLA operations, or JAX's GPU kernel.

    python benchmarks/init_compile.py            # GPT-2 small's shape (on a GPU: ~45 s)
    python benchmarks/init_compile.py --smoke    # a tiny GPT: checks the script runs

`fit` compiles the state's initialisation with threefry lowered to JAX's GPU kernel on a GPU
(`fitjax/step/xla_gpu.py`). This compiles the GPT example's `init` (as a hand-written loop
writes it: `jax.jit(model.init)`) both ways, in that order, each a fresh `jit`, prints the
compile times and checks the parameters are the same bits. On a CPU both lowerings are the same
program (the option is GPU-only): the times then differ only by noise.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a tiny GPT: checks the script runs")
    return parser


if __name__ == "__main__":  # --help (or a wrong argument) answered before JAX is imported
    _parser().parse_args()


if "--smoke" in sys.argv:  # on CPU: no accelerator probe at start-up
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import gpt  # noqa: E402

from fitjax.step import xla_gpu  # noqa: E402


def compile_and_run(model: nn.Module, tokens: jax.Array, platform: str, kernel: bool):
    def init(key):
        return nn.unbox(model.init(key, tokens))["params"]

    started = time.perf_counter()
    if kernel:
        with xla_gpu.rng_kernels(platform):
            compiled = jax.jit(init).lower(jax.random.key(0)).compile()
    else:
        compiled = jax.jit(init).lower(jax.random.key(0)).compile()
    seconds = time.perf_counter() - started
    return seconds, jax.device_get(compiled(jax.random.key(0)))


def main() -> None:
    args = _parser().parse_args()
    shape = dict(layers=1, width=32, heads=2, context=16) if args.smoke else dict(
        layers=12, width=768, heads=12, context=1024)
    model = gpt.gpt_model(**shape)
    tokens = jnp.zeros((2, shape["context"]), jnp.int32)
    device = jax.devices()[0]
    platform = device.platform
    plain_s, plain = compile_and_run(model, tokens, platform, kernel=False)
    kernel_s, drawn = compile_and_run(model, tokens, platform, kernel=True)
    leaves = jax.tree.leaves(plain)
    same = all(np.array_equal(a, b) for a, b in zip(leaves, jax.tree.leaves(drawn)))
    print(f"GPT {shape}: {len(leaves)} parameter arrays, {sum(x.size for x in leaves) / 1e6:.1f} M values; "
          f"jax {jax.__version__} on {device.device_kind} ({platform})")
    print(f"  init compiled, threefry as XLA operations: {plain_s:6.1f} s")
    print(f"  init compiled, threefry as JAX's GPU kernel: {kernel_s:6.1f} s"
          f"{'' if platform == 'gpu' else ' (not a GPU: the same program)'}")
    print(f"  ratio {plain_s / kernel_s:.1f}x; parameters the same bits: {same}")
    if not same:
        raise SystemExit("init_compile.py: the two lowerings drew different parameters")


if __name__ == "__main__":
    main()
