"""The planner against real fits on the device it runs on: is its estimate what the device then does?

    python benchmarks/plan_device.py         # on a TPU chip or a GPU: GPT-2 small's shape (~3 min on an H200)
    python benchmarks/plan_device.py --smoke # a tiny GPT on whatever JAX sees: checks it runs

GPT-2 small's shape (`examples/gpt.py`: 12 blocks of width 768, 12 heads, context 1024), 16 rows a
step, bf16-mixed, one device. The plan sweeps activation rematerialization (none, full) for the
local device (`target="local"`); then each candidate is fitted for `--steps` optimizer steps after
`--warmup` ones, each fit in a process of its own so that the device's high-water mark is that
fit's (the plan, too, runs in a process of its own: one process at a time may hold a TPU chip,
so the parent never starts JAX's backends). Printed per candidate:

- memory: the plan's per-device peak (XLA's memory analysis of the step: arguments, outputs and
  scratch) against the allocator's peak bytes in use during the fit (`memory_stats()`: the step's
  and everything the loop keeps beside it: the batch in flight, the metric values fetched). On a
  TPU the bytes in use leave out the program's temporaries, which the runtime reserves apart:
  there the peak adds `peak_bytes_reserved` where the runtime reports it, and the plan's memory is
  also checked at its boundary: a plan under the chip's memory runs, and one XLA refuses
  (`out_of_memory`, the same compiler's verdict) fails on the chip;
- time: the plan's roofline step time (max of compute at peak FLOP/s and memory traffic at peak
  bandwidth; no overlap modelled) against the measured step time (synced, steady state);
- MFU: model FLOPs (6N + attention, the module's `transformer_shape`) over each time at the
  device kind's peak (`fitjax/planner/_devices.py`).

Last, `--too-big` rows a step (default 16x `--rows`) with no remat: planned, and where the plan says
it does not fit, fitted anyway in a child process to show the device refuses it too. XLA:TPU
rematerializes a program to fit the chip rather than fail, so a plan over its headroom but under
the chip's memory runs, slower: on a v5e GPT-2 small planned 15.2 GiB at 96 rows (6x) and 15.07
GiB at 112, both ran (112 rows 19% slower a token than 16); at 256 rows XLA needs 39.07 GB of
temporaries and refuses (`benchmarks/results/tpu-v5e/`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=16, help="rows (sequences) a step")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30, help="timed optimizer steps per fit")
    parser.add_argument("--too-big", type=int, default=None, help="rows a step for the does-not-fit case "
                                                                 "(default 16x --rows; 0: skip it)")
    parser.add_argument("--remat", action="append", choices=["none", "full", "dots"],
                        help="the candidates' remat (repeatable; default: none and full)")
    parser.add_argument("--json", default=None, help="write the figures here as JSON")
    parser.add_argument("--smoke", action="store_true", help="a tiny GPT, 2 rows, no remat, 2 timed steps: checks it runs")
    parser.add_argument("--fit", metavar="REMAT", help=argparse.SUPPRESS)  # one fit, in a child process
    parser.add_argument("--plan-child", type=int, metavar="ROWS", help=argparse.SUPPRESS)  # one plan, likewise
    return parser


if __name__ == "__main__":  # --help (or a wrong argument) answered before JAX is imported
    _parser().parse_args()


ROOT = os.path.join(os.path.dirname(__file__), "..")
sys.path.insert(0, ROOT)  # this checkout's fitjax
sys.path.insert(0, os.path.join(ROOT, "examples"))

import jax  # noqa: E402
import numpy as np  # noqa: E402

import _results  # noqa: E402

import fitjax as fj  # noqa: E402
import gpt  # noqa: E402
from fitjax.planner import human_bytes, spec_for  # noqa: E402

GPT2_SMALL = dict(layers=12, width=768, heads=12, context=1024, vocab=50304)
TINY = dict(layers=1, width=64, heads=4, context=64, vocab=256)


def _trainer(**kwargs) -> fj.Trainer:
    return fj.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, strategy="single", precision="bf16-mixed", **kwargs)


def _batch(shape: dict, rows: int) -> list[dict]:
    return [{"tokens": np.zeros((rows, shape["context"] + 1), np.int32)}]


class _StepTimer(fj.Callback):
    """Times the optimizer steps after `warmup` (the first compiles), synced at both ends."""

    def __init__(self, warmup: int):
        self.warmup, self.start, self.seconds, self.steps = warmup, None, None, 0

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if trainer.global_step == self.warmup and self.start is None:
            jax.block_until_ready(trainer.state)
            self.start, self.first = time.perf_counter(), trainer.global_step

    def on_train_end(self, trainer, module):
        jax.block_until_ready(trainer.state)
        self.seconds, self.steps = time.perf_counter() - self.start, trainer.global_step - self.first


def fit_one(shape: dict, rows: int, remat: str, warmup: int, steps: int) -> dict:
    """One fit of the configuration; its measured step time and the device's peak bytes."""
    timer = _StepTimer(warmup)
    trainer = _trainer(remat=remat, max_steps=warmup + steps, limit_val_batches=0, callbacks=[timer])
    data = gpt.GPTData(context=shape["context"], batch_size=rows)
    trainer.fit(gpt.GPTModule(**shape), datamodule=data)
    stats = trainer.devices[0].memory_stats() or {}
    # on a TPU `peak_bytes_in_use` alone leaves out the program's temporaries (GPT-2 small, 16
    # rows: 1.56 GiB read against 5.66 GiB planned): the peak adds what the runtime reserves for
    # them (`fj.strategies.peak_bytes`); every counter kept
    return {"step_s": timer.seconds / timer.steps, "peak_bytes": fj.strategies.peak_bytes(stats), "memory_stats": stats,
            "device_kind": trainer.devices[0].device_kind}


def plan_one(shape: dict, rows: int, remats: list[str] | None) -> dict:
    """The plan of `rows` a step (each remat of `remats`; None: as configured) for this machine's
    device, as JSON: the device, the candidates (`Measured.as_dict()`) and the recommended one."""
    sweep = {"remat": remats} if remats else None
    plan = _trainer().plan(gpt.GPTModule(**shape), _batch(shape, rows), sweep=sweep)
    device = jax.devices()[0]
    return {"jax": jax.__version__, "device_kind": device.device_kind, "platform": device.platform,
            "candidates": [measured.as_dict() for measured in plan.candidates],
            "recommended": plan.recommended.name if plan.recommended else None}


def _child(args, *extra: str) -> subprocess.CompletedProcess:
    """This script in a process of its own (one plan, or one fit): a TPU chip is held by one
    process at a time, so the parent never starts JAX's backends."""
    return subprocess.run([sys.executable, __file__, "--warmup", str(args.warmup)] + list(extra)
                          + (["--smoke"] if args.smoke else []), capture_output=True, text=True)


def _planned(args, rows: int, remats: list[str] | None) -> dict:
    child = _child(args, "--plan-child", str(rows), *(f"--remat={r}" for r in remats or []))
    if child.returncode != 0:
        raise SystemExit(f"plan_device.py: planning {rows} rows failed (exit {child.returncode}):\n"
                         f"{child.stderr[-3000:]}")
    return json.loads(child.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    args = _parser().parse_args(argv)
    if args.smoke:  # one warm-up step: the first compiles, the next is timed
        args.warmup = 1
    shape, rows = (TINY, 2) if args.smoke else (GPT2_SMALL, args.rows)
    steps = 2 if args.smoke else args.steps
    if args.fit:
        print(json.dumps(fit_one(shape, rows, args.fit, args.warmup, steps)), flush=True)
        return
    if args.plan_child is not None:
        print(json.dumps(plan_one(shape, args.plan_child, args.remat)), flush=True)
        return
    started = time.perf_counter()
    plan = _planned(args, rows, args.remat or (["none"] if args.smoke else ["none", "full"]))
    print(f"jax {plan['jax']} on {plan['device_kind']} ({plan['platform']}); GPT {shape}, {rows} rows a step, "
          f"bf16-mixed, one device; {steps} timed steps after {args.warmup}", flush=True)
    print(f"planned {len(plan['candidates'])} candidates in {time.perf_counter() - started:.1f} s", flush=True)
    print(f"{'remat':<6}{'peak plan':>11}{'peak fit':>11}{'ratio':>7}{'step plan':>11}{'step fit':>11}"
          f"{'ratio':>7}{'MFU plan':>10}{'MFU fit':>9}", flush=True)
    tokens = rows * shape["context"]
    rows_out = []
    for measured in plan["candidates"]:
        remat = measured["remat"]
        child = _child(args, "--fit", remat, "--steps", str(args.steps), "--rows", str(rows))
        if child.returncode != 0:
            print(f"{remat:<6} the fit failed (exit {child.returncode}):\n{child.stderr[-2000:]}", flush=True)
            rows_out.append({"plan": measured, "fit_error": child.stderr[-2000:]})
            continue
        fit = json.loads(child.stdout.strip().splitlines()[-1])
        planned_peak, fit_peak = measured["memory"]["peak"], fit["peak_bytes"]
        peak_ratio = f"{fit_peak / planned_peak:.2f}" if fit_peak and planned_peak else "-"
        step_plan = measured["step_time_s"]
        step_ratio = f"{fit['step_s'] / step_plan:.2f}" if step_plan else "-"
        spec = spec_for(fit["device_kind"])
        mfu_fit = (measured["model_flops"] / (fit["step_s"] * spec.peak_flops)
                   if spec is not None and measured["model_flops"] else None)
        rows_out.append({"plan": measured, "fit": fit, "mfu_fit": mfu_fit,
                         "peak_fit_over_plan": fit_peak / planned_peak if fit_peak and planned_peak else None,
                         "step_fit_over_plan": fit["step_s"] / step_plan if step_plan else None})
        mfu_plan = measured["mfu"]
        print(f"{remat:<6}{human_bytes(planned_peak) if planned_peak else '-':>11}"
              f"{human_bytes(fit_peak) if fit_peak else '-':>11}{peak_ratio:>7}"
              f"{(f'{step_plan * 1e3:.1f} ms' if step_plan else '-'):>11}{fit['step_s'] * 1e3:>8.1f} ms"
              f"{step_ratio:>7}{(f'{mfu_plan:.0%}' if mfu_plan else '-'):>10}"
              f"{(f'{mfu_fit:.0%}' if mfu_fit else '-'):>9}", flush=True)
    print(f"model FLOPs a step (6N + attention): {plan['candidates'][0]['model_flops']:.3g} "
          f"({tokens} tokens); recommended: {plan['recommended'] or 'none'}", flush=True)
    too_big = _too_big(args, shape, rows)
    _results.record(args.json, {"shape": shape, "rows": rows, "candidates": rows_out, "too_big": too_big})


def _too_big(args, shape: dict, rows: int) -> dict | None:
    """Plans `--too-big` rows with no remat; where the plan says it does not fit, fits it anyway."""
    big = args.too_big if args.too_big is not None else 16 * rows
    if not big:
        return None
    measured = _planned(args, big, None)["candidates"][0]
    out = {"rows": big, "plan": measured, "fits_planned": measured["fits"]}
    ran = ""
    if measured["fits"] is False:
        child = _child(args, "--fit", "none", "--steps", "1", "--rows", str(big))
        refused = child.returncode != 0 and "RESOURCE_EXHAUSTED" in child.stderr
        out.update(fit_returncode=child.returncode, device_refused=refused,
                   fit_said=next((line for line in child.stderr.splitlines() if "RESOURCE_EXHAUSTED" in line), None))
        last = (child.stderr.strip().splitlines() or [""])[-1]
        ran = ("; the device refused it too (out of memory)" if refused else
               "; the device ran it (exit 0)" if child.returncode == 0 else
               f"; the fit failed otherwise (exit {child.returncode}): {last}")
    said = {True: "fits", False: "does not fit", None: "has no memory limit to check"}[measured["fits"]]
    if measured["fits"] is False:
        said += (" (XLA refuses it: over the device's memory)" if measured.get("out_of_memory")
                 else f" (under the device's memory, over the plan's {measured['headroom']:.0%} headroom)")
    peak = measured["memory"]["peak"]
    print(f"{big} rows, no remat: planned peak {human_bytes(peak) if peak else '?'}, the plan says it {said}{ran}",
          flush=True)
    return out


if __name__ == "__main__":
    main()
