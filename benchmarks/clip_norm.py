"""What a global-norm clip costs a small jitted train step, with no fitjax in it, under each of
XLA:CPU's two schedulers.

    python benchmarks/clip_norm.py                 # 5 repeats of 1000 steps per variant, both schedulers
    python benchmarks/clip_norm.py --size mnist    # the MNIST-sized MLP (~270k parameters)
    python benchmarks/clip_norm.py --smoke         # seconds: checks it runs (numbers mean nothing)

Two tables: XLA:CPU's default breadth-first ("concurrency optimized") scheduler, then the
depth-first one `import fitjax` selects (`fitjax/step/xla_cpu.py`). The scheduler is fixed when a
process starts JAX's backends, so each table comes from its own process.

The tiny MLP of `overhead.py` (64-64-10, batch 32, Adam), stepped call after call with its batch
already on the device, so the step's own time is what is measured. Variants, each chained before
Adam: `optax.clip_by_global_norm(1.0)`; fitjax's clip (`fitjax.step.options.clip_by_global_norm`,
the sum of squares as dot products); the norm computed as one matrix product of the concatenated
gradients (no reduction kernel in the compiled program); the norm computed but not used to scale.
Each row is the median over repeats of steps/s against the unclipped step of the same repeat.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time

SIZES = {  # name: (hidden width, input width, batch)
    "tiny": (64, 64, 32),  # overhead.py's tiny MLP: ~9k parameters
    "mnist": (256, 784, 128),  # overhead.py's MNIST-sized MLP: ~270k parameters
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--smoke", action="store_true",
                        help="1 repeat of 20 steps, fitjax's scheduler only: checks the script runs")
    parser.add_argument("--size", choices=tuple(SIZES), default="tiny",
                        help="the tiny MLP (default) or the MNIST-sized one of overhead.py")
    parser.add_argument("--child", choices=("true", "false"), help=argparse.SUPPRESS)
    return parser


if __name__ == "__main__":  # --help (or a wrong argument) answered before JAX is imported
    _parser().parse_args()

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
_SCHEDULER_FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler"
if "--child" in sys.argv:  # the scheduler this process runs with, before fitjax picks its own
    os.environ["XLA_FLAGS"] = f"{_SCHEDULER_FLAG}={sys.argv[sys.argv.index('--child') + 1]}"
from fitjax.step.options import clip_by_global_norm, global_norm  # noqa: E402


class MLP(nn.Module):
    width: int = 64

    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Dense(self.width)(x))
        x = nn.relu(nn.Dense(self.width)(x))
        return nn.Dense(10)(x)


def _transform(update) -> optax.GradientTransformation:
    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def _matmul_norm_clip(max_norm: float) -> optax.GradientTransformation:
    def update(updates, state, params=None):
        flat = jnp.concatenate([leaf.ravel() for leaf in jax.tree.leaves(updates)])
        norm = jnp.sqrt((flat[None, :] @ flat[:, None])[0, 0])
        return jax.tree.map(lambda t: jax.lax.select(norm < max_norm, t, t / norm * max_norm), updates), state

    return _transform(update)


def _norm_unused() -> optax.GradientTransformation:
    def update(updates, state, params=None):
        norm = global_norm(updates)
        return jax.tree.map(lambda t: t + 0 * norm, updates), state

    return _transform(update)


VARIANTS = {
    "unclipped": lambda: optax.adam(1e-3),
    "optax clip_by_global_norm": lambda: optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-3)),
    "fitjax clip (dot norm)": lambda: optax.chain(clip_by_global_norm(1.0), optax.adam(1e-3)),
    "norm as one matmul": lambda: optax.chain(_matmul_norm_clip(1.0), optax.adam(1e-3)),
    "norm computed, unused": lambda: optax.chain(_norm_unused(), optax.adam(1e-3)),
}


def _stepper(model, tx):
    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def step(params, opt_state, x, y):
        def loss_fn(p):
            return optax.softmax_cross_entropy_with_integer_labels(model.apply({"params": p}, x), y).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step


def main(argv=None):
    args = _parser().parse_args(argv)
    if args.child is None:  # one process per scheduler
        import subprocess

        env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
        schedulers = (("true", "XLA's default, breadth-first"), ("false", "depth-first, as fitjax sets it"))
        for value, name in schedulers[1:] if args.smoke else schedulers:  # the smoke: one child runs the code
            print(f"== scheduler: {name} ({_SCHEDULER_FLAG}={value})", flush=True)
            subprocess.run([sys.executable, __file__, *(sys.argv[1:] if argv is None else argv), "--child", value],
                           env=env, check=True)
        return
    if args.smoke:
        args.repeats, args.steps = 1, 20
    rng = np.random.default_rng(0)
    width, inputs, batch = SIZES[args.size]
    x = jax.device_put(rng.normal(size=(batch, inputs)).astype(np.float32))
    y = jax.device_put(rng.integers(0, 10, batch).astype(np.int32))
    model = MLP(width)
    params0 = model.init(jax.random.key(0), x)["params"]
    txs = {name: make() for name, make in VARIANTS.items()}
    steps = {name: _stepper(model, tx) for name, tx in txs.items()}
    rates: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for _ in range(args.repeats):
        for name, step in steps.items():  # variants interleaved within each repeat
            params = jax.tree.map(jnp.array, params0)
            opt_state = txs[name].init(params)
            for _ in range(min(50, args.steps)):  # compile and warm up
                params, opt_state, _ = step(params, opt_state, x, y)
            jax.block_until_ready(params)
            start = time.perf_counter()
            for _ in range(args.steps):
                params, opt_state, _ = step(params, opt_state, x, y)
            jax.block_until_ready(params)
            rates[name].append(args.steps / (time.perf_counter() - start))
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}; {args.repeats} repeats of {args.steps} steps")
    print(f"{'variant':<28} {'steps/s':>9} {'vs unclipped':>13}")
    base = rates["unclipped"]
    for name, runs in rates.items():
        ratio = statistics.median(r / b for r, b in zip(runs, base))
        print(f"{name:<28} {statistics.median(runs):>9.0f} {ratio:>12.2f}x")


if __name__ == "__main__":
    main()
