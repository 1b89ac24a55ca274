"""Gradient accumulation inside one step (fitjax) against `optax.MultiSteps`, per workload.

    python benchmarks/techniques.py --only tiny_mlp --epochs 3
    python benchmarks/techniques.py --smoke        # seconds: checks it runs (numbers mean nothing)

Both accumulate 4 micro-batches per optimizer step. fitjax's `accumulate_grad_batches=4` stacks
them and runs one jitted step (a `lax.scan` over the micro-batches); `optax.MultiSteps(tx, 4)` runs
the plain step 4 times, keeping the gradient sum in the optimizer state. Reported: optimizer steps
per second in steady state (same timer and workloads as `benchmarks/overhead.py`), best of
`--repeats`. `benchmarks/overhead.py --steps-per-execution 8` measures several steps per dispatch.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

from _workload_names import WORKLOAD_NAMES  # overhead.py's, without importing JAX


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=WORKLOAD_NAMES, action="append")
    parser.add_argument("--epochs", type=int, default=3, help="including one warm-up epoch")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--smoke", action="store_true",
                        help="the tiny MLP, 64-step epochs, 1 repeat: checks the script runs in seconds")
    return parser


if __name__ == "__main__":  # --help (or a wrong argument) answered before JAX is imported
    _parser().parse_args()

import jax  # noqa: E402
import optax  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from overhead import WORKLOADS, Classifier, make_data, with_fitjax  # noqa: E402

import fitjax as fj  # noqa: E402,F401  (overhead put the worktree on the path)

K = 4


class MultiStepsClassifier(Classifier):
    def configure_optimizer(self):
        return optax.MultiSteps(super().configure_optimizer(), every_k_schedule=K)


def main(argv=None):
    args = _parser().parse_args(argv)
    workloads = dict(WORKLOADS)
    if args.smoke:
        args.only, args.repeats, args.epochs = ["tiny_mlp"], 1, 2
        factory, shape, batch, _ = WORKLOADS["tiny_mlp"]
        workloads["tiny_mlp"] = (factory, shape, batch, 64)

    print(f"jax {jax.__version__} on {jax.devices()[0].platform}; optimizer steps/s, {K} micro-batches each")
    print(f"{'workload':<11} {'scan in step':>13} {'MultiSteps':>11}")
    with tempfile.TemporaryDirectory() as root:
        for name in args.only or list(WORKLOADS):
            factory, shape, batch_size, steps = workloads[name]
            data = make_data(shape, batch_size * steps)
            scan, multi = [], []
            for _ in range(args.repeats):
                scan.append(with_fitjax(factory(), data, batch_size, args.epochs, root, defaults=False,
                                        accumulate_grad_batches=K))
                # MultiSteps: the trainer counts each micro-batch as a step
                multi.append(with_fitjax(factory(), data, batch_size, args.epochs, root, defaults=False,
                                         module_cls=MultiStepsClassifier) / K)
            print(f"{name:<11} {max(scan):>11.1f}/s {max(multi):>9.1f}/s", flush=True)


if __name__ == "__main__":
    main()
