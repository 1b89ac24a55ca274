"""Per-device memory of the train state and of the compiled step: single vs dp vs fsdp on 8 devices.

    python benchmarks/memory.py            # 8 virtual CPU devices are set up here
    python benchmarks/memory.py --smoke    # a 2x256 MLP: checks it runs in seconds

Prints (1) bytes of params + optimizer state per device, read from the arrays' shardings,
(2) `compiled.memory_analysis()` of the jitted train step: its peak, the arguments it holds and
its temporaries, and (3) what the jitted init writes and uses per device (sharded init: under
fsdp the whole state never exists on one device).
"""

from __future__ import annotations

import argparse
import os
import sys


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="a 2x256 MLP: checks the script runs in seconds")
    return parser


if __name__ == "__main__":  # --help (or a wrong argument) answered before JAX is imported
    _parser().parse_args()


os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))  # this checkout's fitjax

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import fitjax as fj  # noqa: E402
from fitjax import step as step_lib  # noqa: E402
from fitjax.strategies import bytes_per_device  # noqa: E402

WIDTH, DEPTH, BATCH = 1024, 4, 64  # 4 × 1024² params ≈ 16 MiB in float32, ×3 with Adam


class MLP(nn.Module):
    width: int
    depth: int

    @nn.compact
    def __call__(self, x):
        for _ in range(self.depth):
            x = nn.relu(nn.Dense(self.width)(x))
        return nn.Dense(1)(x)


class Module(fj.LitModule):
    def __init__(self, width: int = WIDTH, depth: int = DEPTH):
        super().__init__()
        self.model = MLP(width, depth)

    def loss(self, model, batch):
        return ((model(batch["x"]) - batch["y"]) ** 2).mean()

    def configure_optimizer(self):
        return optax.adam(1e-3)


def measure(strategy: str, devices: int, width: int = WIDTH, depth: int = DEPTH) -> tuple[int, dict]:
    rng = np.random.default_rng(0)
    batch = {"x": rng.normal(size=(BATCH, width)).astype(np.float32),
             "y": rng.normal(size=(BATCH, 1)).astype(np.float32)}
    trainer = fj.Trainer(strategy=strategy, devices=devices, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False)
    state, compiled = step_lib.build(Module(width, depth).step_spec(), trainer.strategy, batch, seed=0)
    held = bytes_per_device((state.params, state.opt_state))
    # Sharded init: compiled with the strategy's out_shardings, it never holds the whole state.
    module = Module(width, depth)
    init = step_lib.forward.make_init_fn(module.step_spec(), optax.adam(1e-3), ("loss",))
    init_stats = jax.jit(init, out_shardings=compiled.state_shardings).lower(
        jax.random.key(0), trainer.strategy.shard_batch(batch), None).compile().memory_analysis()
    stats = compiled.train_step.lower(state, trainer.strategy.shard_batch(batch)).compile().memory_analysis()
    return held, {"peak": stats.peak_memory_in_bytes, "arguments": stats.argument_size_in_bytes,
                  "temp": stats.temp_size_in_bytes,
                  "init": init_stats.output_size_in_bytes + init_stats.temp_size_in_bytes}


def main(argv=None) -> None:
    args = _parser().parse_args(argv)
    width, depth = (256, 2) if args.smoke else (WIDTH, DEPTH)
    mib = 2**20
    results = {name: measure(name, n, width, depth) for name, n in [("single", 1), ("dp", 8), ("fsdp", 8)]}
    base = results["single"][0]
    print(f"MLP {depth}×{width}² + Adam, global batch {BATCH}, {jax.device_count()} {jax.devices()[0].platform} devices")
    print(f"{'strategy':<8} {'params+opt MiB/device':>22} {'vs single':>10} {'step peak MiB':>14} "
          f"{'step args MiB':>14} {'step temp MiB':>14} {'init out+temp MiB':>18}")
    for name, (held, stats) in results.items():
        print(f"{name:<8} {held / mib:>22.2f} {held / base:>10.3f} {stats['peak'] / mib:>14.2f} "
              f"{stats['arguments'] / mib:>14.2f} {stats['temp'] / mib:>14.2f} {stats['init'] / mib:>18.2f}")


if __name__ == "__main__":
    main()
