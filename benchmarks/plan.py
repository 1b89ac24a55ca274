"""The planner against a real fit on this CPU, and the GPT example planned for a TPU slice.

    python benchmarks/plan.py                  # both parts (the TPU part compiles GPT-2-sized steps)
    python benchmarks/plan.py --smoke          # a tiny GPT, one TPU size, fsdp only: checks it runs
    python benchmarks/plan.py --target tpu-v6e-8 --skip-cpu
    python benchmarks/plan.py --time-one       # where one GPT-2-small candidate's planning time goes
    python benchmarks/plan.py --time-one --scan-layers           # the same, its blocks one nn.scan
    python benchmarks/plan.py --skip-cpu --sizes gpt2 --scan-layers --remat none,full
    python benchmarks/plan.py --sweep-all --scan-layers          # sweep=True: 20 candidates on 16 chips

Part 1 (8 virtual CPU devices): the GPT example planned with dp, zero1 and fsdp, then fitted one
step with each. Printed per device (device 0): the planned state (params + optimizer + the rest)
against the bytes the fit's state holds, and the planned peak of the step against the live bytes
after it (the state, the module's copy of the parameters and what the loop keeps); ratios
measured / planned.

Part 2 (libtpu, deviceless, `--target`): the GPT example at three sizes in bf16-mixed, each
planned with every strategy the sweep makes for the target (dp, zero1, fsdp, hybrid fsdp, fsdp x
tensor) and each `--remat` policy: which fit the chip's memory (10% headroom), the recommended
strategy, its estimated step time and MFU (6N + attention model FLOPs over the roofline's time at
peak), and how long planning took. `--sizes wide` (default): 2 blocks of width 1024, 2048 and
6144 (25 M to 0.9 G parameters: the largest does not fit a v5e chip with dp), context 256, 32
rows a step; `--sizes gpt2`: GPT-2 small, medium and large shapes (12/24/36 blocks of width
768/1024/1280), context 1024, 64 rows: with `--scan-layers` (one block compiled) ~30-40 s a
candidate here, unrolled minutes.

`--time-one`: one candidate of GPT-2 small's shape (fsdp on the target), its planning time split
into building the abstract program, lowering it, XLA's compilation and reading the analyses
(memory, cost with loops per iteration, collectives), wall and CPU seconds, with the machine's
load average. `--scan-layers`: the GPT's blocks as one `nn.scan` (one block compiled).
`--sweep-all`: GPT-2 small planned with `sweep=True` for the target (20 candidates on 16 chips:
5 strategies x 2 micro-batchings x 2 remat policies), the plan's table and its planning time.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time


# name -> (the three sizes, context, rows a step)
SIZES = {"gpt2": ({"small": dict(layers=12, width=768, heads=12), "medium": dict(layers=24, width=1024, heads=16),
                   "large": dict(layers=36, width=1280, heads=20)}, 1024, 64),
         "wide": ({"w1024": dict(layers=2, width=1024, heads=16), "w2048": dict(layers=2, width=2048, heads=16),
                   "w6144": dict(layers=2, width=6144, heads=48)}, 256, 32)}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a tiny GPT, one TPU size, fsdp only: checks it runs")
    parser.add_argument("--target", default="tpu-v5e-16", help="the TPU slice of part 2 (default tpu-v5e-16)")
    parser.add_argument("--skip-cpu", action="store_true", help="only part 2")
    parser.add_argument("--skip-tpu", action="store_true", help="only part 1")
    parser.add_argument("--sizes", choices=sorted(SIZES), default="wide", help="part 2's three sizes")
    parser.add_argument("--time-one", action="store_true", help="only: one GPT-2-small candidate's time, split")
    parser.add_argument("--sweep-all", action="store_true",
                        help="only: GPT-2 small planned with sweep=True (every candidate) for the target, timed")
    parser.add_argument("--remat", default="none", help="part 2's remat policies, comma-separated (none,full)")
    parser.add_argument("--scan-layers", action="store_true",
                        help="the GPT's blocks as one nn.scan (GPTModule(scan_layers=True)): one block compiled "
                             "(part 2 and --time-one)")
    return parser


if __name__ == "__main__":  # --help (or a wrong argument) answered before JAX is imported
    _parser().parse_args()


os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

ROOT = os.path.join(os.path.dirname(__file__), "..")
sys.path.insert(0, ROOT)  # this checkout's fitjax
sys.path.insert(0, os.path.join(ROOT, "examples"))

import jax  # noqa: E402
import numpy as np  # noqa: E402

import fitjax as fj  # noqa: E402
import gpt  # noqa: E402
from fitjax.planner import human_bytes, resolve_target  # noqa: E402
from fitjax.planner._sweep import strategy_variants  # noqa: E402

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


def _short(strategy: str) -> str:
    """A column header: hybrid fsdp and fsdp x tensor by what they add."""
    return "hybrid" if strategy.startswith("fsdp(data") else "tensor" if "tensor" in strategy else strategy


def tpu_part(target: str, sizes: dict, context: int, rows: int, strategies: list[str], remats: list[str],
             scan_layers: bool) -> None:
    print(f"\nthe GPT example planned for {target}: context {context}, {rows} rows a step, bf16-mixed, "
          f"strategies {', '.join(strategies)}, remat {', '.join(remats)}, "
          f"blocks {'scanned' if scan_layers else 'unrolled'}; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"{'size':<8}{'remat':<6}{'params':>7}" + "".join(f"{_short(s) + ' peak':>13}" for s in strategies)
          + f"  {'recommended':<34}{'step (est.)':>12}{'MFU (est.)':>11}{'planning':>10}{'(CPU)':>7}")
    batch = [{"tokens": np.zeros((rows, context + 1), np.int32)}]
    for size, shape in sizes.items():
        module = gpt.GPTModule(**shape, context=context, scan_layers=scan_layers)
        started, cpu = time.perf_counter(), time.process_time()
        plan = fj.plan(module, batch, target=target, strategy=fj.strategies.FSDP(rules=gpt.GPT_RULES),
                       precision="bf16-mixed", sweep={"strategy": strategies, "remat": remats})
        took, took_cpu = time.perf_counter() - started, time.process_time() - cpu
        by_name = {m.name: m for m in plan.candidates}
        params = sum(int(np.prod(p.shape)) for p in jax.tree.leaves(jax.eval_shape(
            lambda: module.model.init(jax.random.key(0), np.zeros((1, context), np.int32)))["params"]))

        def peak(strategy: str, remat: str) -> str:
            m = by_name.get(strategy if remat == "none" else f"{strategy} remat={remat}")
            return "failed" if m is None else human_bytes(m.memory["peak"]) + ("" if m.fits else " ✗")

        best = plan.recommended
        step = f"{best.step_time_s * 1e3:.3g} ms" if best and best.step_time_s else "-"
        mfu = f"{best.mfu:.0%}" if best and best.mfu else "-"
        for i, remat in enumerate(remats):
            first = i == 0
            print(f"{size if first else '':<8}{remat:<6}{f'{params / 1e6:.0f}M' if first else '':>7}"
                  + "".join(f"{peak(s, remat):>13}" for s in strategies)
                  + (f"  {best.name if best else 'none fits':<34}{step:>12}{mfu:>11}{took:>9.0f}s{took_cpu:>6.0f}s"
                     if first else ""))
    print("peak: per chip, XLA:TPU's memory analysis (✗: over the chip's memory less 10% headroom, or refused by "
          "the compiler); step and MFU: the planner's roofline estimate, no compute/communication overlap; "
          "planning: wall and CPU seconds for the size's candidates")


def sweep_all(target: str, scan_layers: bool) -> None:
    """GPT-2 small planned with `sweep=True`: every candidate the planner makes for the target."""
    module = gpt.GPTModule(layers=12, width=768, heads=12, context=1024, scan_layers=scan_layers)
    batch = [{"tokens": np.zeros((64, 1025), np.int32)}]
    started, cpu = time.perf_counter(), time.process_time()
    plan = fj.plan(module, batch, target=target, strategy=fj.strategies.FSDP(rules=gpt.GPT_RULES),
                   precision="bf16-mixed", sweep=True)
    took, took_cpu = time.perf_counter() - started, time.process_time() - cpu
    print(plan)
    n = len(plan.candidates) + len(plan.failed)
    print(f"GPT-2 small ({'blocks scanned' if scan_layers else 'blocks unrolled'}), sweep=True for {target}: "
          f"{n} candidates planned in {took:.0f} s wall, {took_cpu:.0f} s CPU ({took / n:.1f} s wall a candidate); "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (target: 20 candidates in 3 minutes)")


def time_one(target: str, scan_layers: bool) -> None:
    """One GPT-2-small candidate (fsdp, 64 rows of 1024, bf16-mixed) planned, its time split."""
    from fitjax import precision as precision_lib
    from fitjax import step as step_lib
    from fitjax.planner import collectives, quiet_stderr
    from fitjax.step import jitted

    started, cpu = time.perf_counter(), time.process_time()
    devices = resolve_target(target, jax.devices()).devices
    strategy = fj.strategies.FSDP(rules=gpt.GPT_RULES)
    strategy.setup(devices)
    options = step_lib.StepOptions(precision=precision_lib.resolve("bf16-mixed"))
    spec = gpt.GPTModule(layers=12, width=768, heads=12, context=1024, scan_layers=scan_layers).step_spec()
    batch = {"tokens": jax.ShapeDtypeStruct((64, 1025), np.int32)}
    marks = [("target", time.perf_counter(), time.process_time())]
    with quiet_stderr(), options.precision.context():
        program = jitted.abstract_train(spec, strategy, batch, options=options)
        marks.append(("abstract program", time.perf_counter(), time.process_time()))
        lowered = program.train_step.lower(program.state, program.inputs)
        marks.append(("lowering", time.perf_counter(), time.process_time()))
        compiled = lowered.compile()
        marks.append(("XLA compile", time.perf_counter(), time.process_time()))
        text = compiled.as_text()
        cost = jitted.cost_of(compiled, text)  # loop bodies counted per iteration
        collectives(text, len(devices))
        compiled.memory_analysis()
        marks.append(("analyses", time.perf_counter(), time.process_time()))
    print(f"one GPT-2-small candidate (fsdp, 64 x 1024 tokens, bf16-mixed, "
          f"{'blocks scanned' if scan_layers else 'blocks unrolled'}) planned for {target}; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    last = (started, cpu)
    for name, wall, used in marks:
        print(f"  {name:<18}{wall - last[0]:>8.1f} s wall{used - last[1]:>8.1f} s CPU")
        last = (wall, used)
    print(f"  {'total':<18}{last[0] - started:>8.1f} s wall{last[1] - cpu:>8.1f} s CPU (target: under 20 s)")
    print(f"  XLA FLOPs a chip: {cost['flops'] / 1e12:.2f} TFLOP; compiled HLO text {len(text) / 1e6:.1f} MB")


def main() -> None:
    args = _parser().parse_args()
    if args.time_one:
        return time_one(args.target, args.scan_layers)
    if args.sweep_all:
        return sweep_all(args.target, args.scan_layers)
    if not args.skip_cpu:
        shape = dict(layers=1, width=32, heads=2, context=32) if args.smoke else dict(
            layers=4, width=256, heads=4, context=128)
        cpu_part(shape, rows=16 if args.smoke else 32)
    if not args.skip_tpu:
        sizes, context, rows = ({"tiny": dict(layers=1, width=64, heads=2)}, 64, 16) if args.smoke else SIZES[args.sizes]
        strategies = ["fsdp"] if args.smoke else list(strategy_variants(
            fj.strategies.FSDP(rules=gpt.GPT_RULES), resolve_target(args.target, jax.devices()).devices))
        tpu_part(args.target, sizes, context=context, rows=rows, strategies=strategies,
                 remats=args.remat.split(","), scan_layers=args.scan_layers)


if __name__ == "__main__":
    main()
