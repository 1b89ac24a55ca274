"""Time to the first step of a hand-written loop of examples/gpt.py's model and step: the figure
beside fitjax's (`first_output.py --example gpt.py`) with JAX's persistent compile cache warm.

    python benchmarks/first_step_hand.py --preset gpt2-small --compile-cache /tmp/hand   # twice: cold, warm
    python benchmarks/first_step_hand.py --smoke     # the tiny preset, one step: checks it runs
    python benchmarks/first_output.py --example gpt.py --hand --compile-cache /tmp/c -- --preset gpt2-small \\
        --max-steps 30 --sample-length 0           # fitjax's example and this loop, cold and warm, side by side

What a JAX user writes to train the example's model, and nothing else: the example's data windows
(`gpt.splits`) and model (`gpt.gpt_model`, `fitjax.models.CausalLM` in GPT-2's layout), the
parameters made by a jitted init, the optimizer state by a jitted `tx.init`, and the train step of
benchmarks/gpt.py's hand-written loop (bfloat16 compute over float32 masters, the preset's
accumulation in a `lax.scan`, clipping at global norm 1.0 chained before AdamW with warmup-cosine,
the state donated) jitted and called on a batch, its loss fetched. No sanity validation, summary,
logger, checkpoint or progress bar (the example has them all). JAX's persistent compile cache is
turned on as a JAX user does (`jax_compilation_cache_dir`, JAX's thresholds) in `--compile-cache`.

Prints, as seconds since the process started (the kernel's start time of this process, read from
/proc: the interpreter's start and every import included), when each phase ended, then
`hand-written first step done at X s`: the line `first_output.py --hand` times from the outside.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent
MARK = "hand-written first step done"  # what first_output.py reads


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="gpt2-small", help="examples/gpt.py's preset (model, batch, recipe)")
    parser.add_argument("--steps", type=int, default=3, help="steps after the first (each fetches its loss)")
    parser.add_argument("--compile-cache", default=None,
                        help="JAX's persistent compile cache folder (default: none, or JAX_COMPILATION_CACHE_DIR)")
    parser.add_argument("--smoke", action="store_true", help="the tiny preset, one step: checks the script runs")
    return parser


def since_start() -> float:
    """Seconds since this process started (the kernel's record, 10 ms resolution on Linux); since
    this module was imported where /proc is not there."""
    try:
        ticks = os.sysconf("SC_CLK_TCK")
        started = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19]) / ticks
        return float(Path("/proc/uptime").read_text().split()[0]) - started
    except (OSError, ValueError, IndexError):
        return time.perf_counter() - _IMPORTED


_IMPORTED = time.perf_counter()
if __name__ == "__main__":  # --help (or a wrong argument) answered before JAX is imported
    _ARGS = _parser().parse_args()


def _benchmark_gpt():
    """benchmarks/gpt.py (its hand-written step), which imports examples/gpt.py as `gpt`. Loaded
    as if on a device: otherwise its import sets 8 virtual CPU devices; this process keeps JAX's
    own choice (the chip, or one CPU device), as the example does."""
    spec = importlib.util.spec_from_file_location("_benchmark_gpt", _HERE / "gpt.py")
    module = importlib.util.module_from_spec(spec)
    argv, sys.argv = sys.argv, [sys.argv[0], "--device"]
    try:
        spec.loader.exec_module(module)
    finally:
        sys.argv = argv
    return module


def main(args: argparse.Namespace) -> None:
    phases: list[tuple[str, float]] = []

    def mark(name: str) -> None:
        phases.append((name, since_start()))

    if args.smoke:
        args.preset, args.steps = "tiny", 0
    import jax

    if args.compile_cache:
        jax.config.update("jax_compilation_cache_dir", args.compile_cache)
    import jax.numpy as jnp
    import numpy as np
    import optax

    bench = _benchmark_gpt()
    gpt = bench.gpt
    preset = gpt.PRESETS[args.preset]
    mark("imports")

    train, _ = gpt.splits(preset["context"])
    data = train["tokens"]
    accumulate, batch = preset["accumulate"], preset["batch_size"]
    shape = {key: preset[key] for key in ("layers", "width", "heads", "context")}
    model = gpt.gpt_model(**shape, vocab=preset.get("vocab", gpt.VOCAB))
    tx = optax.chain(optax.clip_by_global_norm(bench.CLIP), bench.optimizer(preset["lr"], preset["max_steps"]))
    mark("data and model")

    example = jnp.zeros((batch, preset["context"]), jnp.int32)
    params = jax.jit(lambda key: model.init(key, example)["params"])(jax.random.key(0))
    opt_state = jax.jit(tx.init)(params)
    jax.block_until_ready(opt_state)
    mark("init")

    step = jax.jit(bench.hand_written_step(model, tx), donate_argnums=(0, 1))
    order = np.random.default_rng(0).permutation(len(data))
    per_step = accumulate * batch

    def micro(i: int) -> np.ndarray:
        rows = order[(i * per_step) % (len(order) - per_step):][:per_step]
        return data[rows].reshape(accumulate, batch, -1)

    params, opt_state, loss = step(params, opt_state, micro(0))
    first_loss = float(loss)  # the step done: its loss on the host
    mark("first step")
    print(f"{MARK} at {phases[-1][1]:.2f} s (loss {first_loss:.3f})", flush=True)
    for i in range(1, args.steps + 1):
        params, opt_state, loss = step(params, opt_state, micro(i))
    if args.steps:
        float(loss)
        mark(f"{args.steps} more steps")
    before = 0.0
    for name, at in phases:
        print(f"  {name:<16} done at {at:7.2f} s  (+{at - before:.2f} s)")
        before = at
    print(f"{jax.devices()[0].device_kind}, preset {args.preset}, compile cache "
          f"{jax.config.jax_compilation_cache_dir or 'off'}")


if __name__ == "__main__":
    main(_ARGS)
