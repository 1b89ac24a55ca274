"""LLVM's optimisation level for fitjax's CPU programs: compile time and step time, level 3 against 2.

    python benchmarks/compile_level.py             # every workload, 2 repeats (a few minutes on 2 cores)
    python benchmarks/compile_level.py --only mnist_port --repeats 3
    python benchmarks/compile_level.py --smoke     # two tiny workloads, once: checks it runs

XLA:CPU optimises the LLVM IR of each kernel it generates at `xla_backend_optimization_level`
(XLA's default 3); fitjax compiles its programs at 2 (`fitjax/step/xla_cpu.py`). Each workload is
the same fit (defaults off, the same seed and data) run at level 3 and at level 2, alternated in
one process. Columns, medians over repeats:

- `compile 3`, `compile 2`: the seconds XLA spent compiling the fit's train steps (JAX's compile
  events; several for a workload whose batches come in several shapes);
- `step 3`, `step 2`: steady-state ms per optimizer step (epochs after the first, timed by
  `overhead.py`'s `SteadyStateTimer`);
- `bits`: `same` when both levels trained to the same parameters, bit for bit.

Workloads: overhead.py's tiny MLP, MNIST-sized MLP and small CNN (Adam); Flax's MNIST CNN as
`examples/flax_mnist.py` ports it (batch norm, dropout, SGD with momentum); Flax's SST-2 BiLSTM
(`examples/flax_sst2.py`: bucketed widths, one program each); `examples/gpt.py`'s transformer
(bf16 mixed precision, 2 accumulated micro-batches, clipping, AdamW).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import sys
import tempfile
from pathlib import Path

NAMES = ("tiny_mlp", "mnist_mlp", "small_cnn", "mnist_port", "sst2_port", "gpt")  # WORKLOADS' names, for --help


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--only", choices=sorted(NAMES), action="append")
    parser.add_argument("--smoke", action="store_true", help="one repeat of two tiny fits: checks it runs")
    return parser


if __name__ == "__main__":  # --help (or a wrong argument) answered before JAX is imported
    _parser().parse_args()

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # libtpu in the dev extra: no TPU probe at start-up

import jax  # noqa: E402
import jax.monitoring  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import flax_mnist  # noqa: E402
import flax_sst2  # noqa: E402
import gpt  # noqa: E402
import overhead  # noqa: E402

import fitjax as fj  # noqa: E402
from fitjax.step import xla_cpu  # noqa: E402

_COMPILES: list[float] = []


def _listen(event: str, seconds: float, **kwargs) -> None:
    if event.endswith("backend_compile_duration") and "train_step" in str(kwargs.get("fun_name")):
        _COMPILES.append(seconds)


jax.monitoring.register_event_duration_secs_listener(_listen)


def _overhead(name: str, smoke: bool):
    factory, shape, batch, steps = overhead.WORKLOADS[name]
    steps = 16 if smoke else steps
    data = overhead.make_data(shape, batch * steps)
    return (lambda: overhead.Classifier(factory()),
            lambda: fj.DataLoader(data, batch_size=batch, shuffle=True, drop_last=True, seed=0),
            dict(max_epochs=2 if smoke else 3))


def _mnist(smoke: bool):
    train, _ = flax_mnist.splits()
    if not smoke:
        train = {k: np.concatenate([v] * 4) for k, v in train.items()}
    return (flax_mnist.MNISTClassifier,
            lambda: fj.DataLoader(train, batch_size=128, shuffle=True, drop_last=True, seed=0),
            dict(max_epochs=2 if smoke else 3))


def _sst2(smoke: bool):
    n, width = (256, 8) if smoke else (2000, 24)
    return (flax_sst2.SST2Classifier,
            lambda: flax_sst2.BucketedBatches(flax_sst2.sentences(n, 0, width), shuffle=True, seed=0, drop_last=True),
            dict(max_epochs=2 if smoke else 3))


def _gpt(smoke: bool):
    context, batches, epochs = (32, 4, 2) if smoke else (128, 20, 3)  # 2 batches an optimizer step
    train, _ = gpt.splits(context)
    module = lambda: gpt.GPTModule(layers=2, width=64 if smoke else 128, heads=4, context=context,  # noqa: E731
                                   lr=1e-3, warmup=2, total_steps=epochs * batches // 2)
    return (module, lambda: fj.DataLoader(train, batch_size=16, shuffle=True, drop_last=True, seed=0),
            dict(max_epochs=epochs, limit_train_batches=batches, precision="bf16-mixed", accumulate_grad_batches=2,
                 gradient_clip_val=1.0))


WORKLOADS = {
    "tiny_mlp": lambda smoke: _overhead("tiny_mlp", smoke),
    "mnist_mlp": lambda smoke: _overhead("mnist_mlp", smoke),
    "small_cnn": lambda smoke: _overhead("small_cnn", smoke),
    "mnist_port": _mnist,
    "sst2_port": _sst2,
    "gpt": _gpt,
}
assert tuple(WORKLOADS) == NAMES


def fit_at(level: int, module_fn, loader_fn, trainer_kwargs: dict):
    """(train-step compile seconds, ms per step, parameters) of one fit at LLVM `level`."""
    xla_cpu._LEVEL = level  # noqa: SLF001  # the one setting this script compares
    jax.clear_caches()
    _COMPILES.clear()
    timer = overhead.SteadyStateTimer()
    sink = io.StringIO()
    with tempfile.TemporaryDirectory() as root, contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        trainer = fj.Trainer(default_root_dir=root, seed=0, callbacks=[timer], enable_progress_bar=False,
                             enable_model_summary=False, logger=False, enable_checkpointing=False,
                             num_sanity_val_steps=0, **trainer_kwargs)
        trainer.fit(module_fn(), loader_fn())
    return sum(_COMPILES), 1000 / timer.timing, jax.device_get(trainer.state.params)


def same_bits(a, b) -> bool:
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(la) == len(lb) and all(np.array_equal(x, y) for x, y in zip(la, lb))


def main(argv=None) -> None:
    args = _parser().parse_args(argv)
    repeats = 1 if args.smoke else args.repeats
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}; {repeats} repeat(s), levels alternated; "
          f"load {os.getloadavg()[0]:.2f}", flush=True)
    print(f"{'workload':<11} {'compile 3':>9} {'compile 2':>9} {'step 3':>8} {'step 2':>8}  bits", flush=True)
    smoke_rows = ("tiny_mlp", "gpt")  # one of each timer (epochs, steps): the script's paths
    for name in args.only or (smoke_rows if args.smoke else WORKLOADS):
        module_fn, loader_fn, trainer_kwargs = WORKLOADS[name](args.smoke)
        results: dict[int, list] = {3: [], 2: []}
        for _ in range(repeats):
            for level in (3, 2):
                results[level].append(fit_at(level, module_fn, loader_fn, trainer_kwargs))
        compile3, compile2 = (statistics.median(r[0] for r in results[lv]) for lv in (3, 2))
        step3, step2 = (statistics.median(r[1] for r in results[lv]) for lv in (3, 2))
        bits = "same" if same_bits(results[3][0][2], results[2][0][2]) else "DIFFER"
        print(f"{name:<11} {compile3:>8.2f}s {compile2:>8.2f}s {step3:>6.2f}ms {step2:>6.2f}ms  {bits}", flush=True)
    xla_cpu._LEVEL = 2  # noqa: SLF001
    print(f"load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
