"""The planner against a real fit on this CPU, and the GPT example planned for a TPU slice.

    python benchmarks/plan.py                  # both parts (the TPU part compiles GPT-2-sized steps)
    python benchmarks/plan.py --smoke          # a tiny GPT, one TPU size, fsdp only: checks it runs
    python benchmarks/plan.py --target tpu-v6e-8 --skip-cpu
    python benchmarks/plan.py --time-one       # where one GPT-2-small candidate's planning time goes

Part 1 (8 virtual CPU devices): the GPT example planned with dp, zero1 and fsdp, then fitted one
step with each. Printed per device (device 0): the planned state (params + optimizer + the rest)
against the bytes the fit's state holds, and the planned peak of the step against the live bytes
after it (the state, the module's copy of the parameters and what the loop keeps); ratios
measured / planned.

Part 2 (libtpu, deviceless, `--target`): the GPT example at three sizes in bf16-mixed, each
planned with dp, zero1 and fsdp: which fit the chip's memory (10% headroom), the recommended
strategy, its estimated step time and MFU (6N + attention model FLOPs over the roofline's time at
peak), and how long planning took. `--sizes wide` (default): 2 blocks of width 1024, 2048 and
6144 (25 M to 0.9 G parameters: the largest does not fit a v5e chip with dp), context 256, 32
rows a step; `--sizes gpt2`: GPT-2 small, medium and large shapes (12/24/36 blocks of width
768/1024/1280), context 1024, 64 rows, whose compilation takes minutes per candidate on a CPU core.

`--time-one`: one candidate of GPT-2 small's shape (fsdp on the target), its planning time split
into building the abstract program, lowering it and XLA's compilation, wall and CPU seconds, with
the machine's load average.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

ROOT = os.path.join(os.path.dirname(__file__), "..")
sys.path.insert(0, ROOT)  # this checkout's fitjax
sys.path.insert(0, os.path.join(ROOT, "examples"))

import jax  # noqa: E402
import numpy as np  # noqa: E402

import fitjax as fj  # noqa: E402
import gpt  # noqa: E402
from fitjax.planner import human_bytes  # noqa: E402

# name -> (the three sizes, context, rows a step)
SIZES = {"gpt2": ({"small": dict(layers=12, width=768, heads=12), "medium": dict(layers=24, width=1024, heads=16),
                   "large": dict(layers=36, width=1280, heads=20)}, 1024, 64),
         "wide": ({"w1024": dict(layers=2, width=1024, heads=16), "w2048": dict(layers=2, width=2048, heads=16),
                   "w6144": dict(layers=2, width=6144, heads=48)}, 256, 32)}
STRATEGIES = ["dp", "zero1", "fsdp"]


def _quiet(**kwargs) -> fj.Trainer:
    return fj.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, **kwargs)


def _device_bytes(tree, device) -> int:
    return sum(s.data.nbytes for x in jax.tree.leaves(tree) for s in x.addressable_shards if s.device == device)


def _live_bytes(device) -> int:
    return sum(s.data.nbytes for a in jax.live_arrays() for s in a.addressable_shards if s.device == device)


def cpu_part(shape: dict, rows: int) -> None:
    data = gpt.GPTData(context=shape["context"], batch_size=rows)
    module_args = dict(shape)
    plan = _quiet(strategy=fj.strategies.FSDP(rules=gpt.GPT_RULES)).plan(
        gpt.GPTModule(**module_args), datamodule=data, sweep={"strategy": STRATEGIES})
    print(f"planned vs measured on this CPU: GPT {module_args}, {rows} rows, 8 devices (device 0)")
    print(f"{'strategy':<9}{'state plan':>12}{'state fit':>12}{'ratio':>7}{'peak plan':>12}{'live after':>12}"
          f"{'ratio':>7}")
    for measured in plan.candidates:
        name = measured.name
        strategy = fj.strategies.FSDP(rules=gpt.GPT_RULES) if name == "fsdp" else name
        trainer = _quiet(strategy=strategy, max_steps=1, limit_val_batches=0)
        device = trainer.devices[0]
        gc.collect()  # the previous fit's arrays gone before counting
        before = _live_bytes(device)
        trainer.fit(gpt.GPTModule(**module_args), datamodule=data)
        state = _device_bytes(trainer.state, device)
        live = _live_bytes(device) - before
        planned = measured.memory["params"] + measured.memory["optimizer"] + measured.memory["other_state"]
        peak = measured.memory["peak"]
        print(f"{name:<9}{human_bytes(planned):>12}{human_bytes(state):>12}{state / planned:>7.2f}"
              f"{human_bytes(peak):>12}{human_bytes(live):>12}{live / peak:>7.2f}")
        del trainer
        gc.collect()


def tpu_part(target: str, sizes: dict, context: int, rows: int, strategies: list[str]) -> None:
    print(f"\nthe GPT example planned for {target}: context {context}, {rows} rows a step, bf16-mixed, "
          f"strategies {', '.join(strategies)}")
    print(f"{'size':<8}{'params':>8}{'dp peak':>11}{'zero1 peak':>12}{'fsdp peak':>11}  {'recommended':<12}"
          f"{'step (est.)':>12}{'MFU (est.)':>11}{'planning':>10}")
    batch = [{"tokens": np.zeros((rows, context + 1), np.int32)}]
    for size, shape in sizes.items():
        module = gpt.GPTModule(**shape, context=context)
        started = time.perf_counter()
        plan = fj.plan(module, batch, target=target, strategy=fj.strategies.FSDP(rules=gpt.GPT_RULES),
                       precision="bf16-mixed", sweep={"strategy": strategies})
        took = time.perf_counter() - started
        by_name = {m.name: m for m in plan.candidates}
        params = sum(int(np.prod(p.shape)) for p in jax.tree.leaves(jax.eval_shape(
            lambda: module.model.init(jax.random.key(0), np.zeros((1, context), np.int32)))["params"]))

        def peak(name: str) -> str:
            m = by_name.get(name)
            if name not in strategies:
                return "-"
            return "failed" if m is None else human_bytes(m.memory["peak"]) + ("" if m.fits else " ✗")

        best = plan.recommended
        step = f"{best.step_time_s * 1e3:.3g} ms" if best and best.step_time_s else "-"
        mfu = f"{best.mfu:.0%}" if best and best.mfu else "-"
        print(f"{size:<8}{params / 1e6:>7.0f}M{peak('dp'):>11}{peak('zero1'):>12}{peak('fsdp'):>11}  "
              f"{best.name if best else 'none fits':<12}{step:>12}{mfu:>11}{took:>9.0f}s")
    print("peak: per chip, XLA:TPU's memory analysis (✗: over the chip's memory less 10% headroom, or refused by "
          "the compiler); step and MFU: the planner's roofline estimate, no compute/communication overlap")


def time_one(target: str) -> None:
    """One GPT-2-small candidate (fsdp, 64 rows of 1024, bf16-mixed) planned, its time split."""
    from fitjax import precision as precision_lib
    from fitjax import step as step_lib
    from fitjax.planner import resolve_target, quiet_stderr
    from fitjax.step import jitted

    started, cpu = time.perf_counter(), time.process_time()
    devices = resolve_target(target, jax.devices()).devices
    strategy = fj.strategies.FSDP(rules=gpt.GPT_RULES)
    strategy.setup(devices)
    options = step_lib.StepOptions(precision=precision_lib.resolve("bf16-mixed"))
    spec = gpt.GPTModule(layers=12, width=768, heads=12, context=1024).step_spec()
    batch = {"tokens": jax.ShapeDtypeStruct((64, 1025), np.int32)}
    marks = [("target", time.perf_counter(), time.process_time())]
    with quiet_stderr(), options.precision.context():
        program = jitted.abstract_train(spec, strategy, batch, options=options)
        marks.append(("abstract program", time.perf_counter(), time.process_time()))
        lowered = program.train_step.lower(program.state, program.inputs)
        marks.append(("lowering", time.perf_counter(), time.process_time()))
        lowered.compile()
        marks.append(("XLA compile", time.perf_counter(), time.process_time()))
    print(f"one GPT-2-small candidate (fsdp, 64 x 1024 tokens, bf16-mixed) planned for {target}; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    last = (started, cpu)
    for name, wall, used in marks:
        print(f"  {name:<18}{wall - last[0]:>8.1f} s wall{used - last[1]:>8.1f} s CPU")
        last = (wall, used)
    print(f"  {'total':<18}{last[0] - started:>8.1f} s wall{last[1] - cpu:>8.1f} s CPU (target: under 20 s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a tiny GPT, one TPU size, fsdp only: checks it runs")
    parser.add_argument("--target", default="tpu-v5e-16", help="the TPU slice of part 2 (default tpu-v5e-16)")
    parser.add_argument("--skip-cpu", action="store_true", help="only part 2")
    parser.add_argument("--skip-tpu", action="store_true", help="only part 1")
    parser.add_argument("--sizes", choices=sorted(SIZES), default="wide", help="part 2's three sizes")
    parser.add_argument("--time-one", action="store_true", help="only: one GPT-2-small candidate's time, split")
    args = parser.parse_args()
    if args.time_one:
        return time_one(args.target)
    if not args.skip_cpu:
        shape = dict(layers=1, width=32, heads=2, context=32) if args.smoke else dict(
            layers=4, width=256, heads=4, context=128)
        cpu_part(shape, rows=16 if args.smoke else 32)
    if not args.skip_tpu:
        sizes, context, rows = ({"tiny": dict(layers=1, width=64, heads=2)}, 64, 16) if args.smoke else SIZES[args.sizes]
        tpu_part(args.target, sizes, context=context, rows=rows,
                 strategies=["fsdp"] if args.smoke else STRATEGIES)


if __name__ == "__main__":
    main()
