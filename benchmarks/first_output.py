"""Time to first output: how long `examples/digits.py` leaves a new user looking at nothing.

    python benchmarks/first_output.py              # 3 runs of `examples/digits.py --epochs 3`
    python benchmarks/first_output.py --smoke      # 1 run: checks it runs
    python benchmarks/first_output.py --runs 5 -- --strategy dp
    python benchmarks/first_output.py --before /tmp/old-checkout   # alternate runs of two checkouts
    python benchmarks/first_output.py --compile-cache /tmp/xla-cache  # and runs with a warm compile cache
    python benchmarks/first_output.py --example gpt.py --runs 1 --compile-cache /tmp/c -- --preset gpt2-small \
        --max-steps 30 --sample-length 0                  # the GPT example, cold and warm (a chip)
    python benchmarks/first_output.py --example gpt.py --hand --runs 1 --compile-cache /tmp/c -- --preset \
        gpt2-small --max-steps 30 --sample-length 0       # and a hand-written loop of its model beside it

Runs the example in a pseudo-terminal (as a user's shell does, so the live bar is drawn) and reads
its output as it arrives. Reports, per run, seconds from process start to:
  - the first printed character,
  - the first training step completed (the bar's counter leaves 0/N),
  - the process exit.
Medians over the runs are printed last. `--example` runs another example (its options after `--`;
digits.py alone gets `--epochs 3`). Every run but the warm cache's has fitjax's compile cache off
(`FITJAX_COMPILE_CACHE=0`) and no JAX cache of the caller's (`JAX_COMPILATION_CACHE_DIR` is dropped,
but for `--smoke`), so each compiles from scratch. The first run after a boot or a new install also
pays for cold file caches; later runs show the steady state.

`--hand` (with `--example gpt.py`) adds the baseline: `first_step_hand.py`, a hand-written loop of
the example's model and step with the same `--preset`, as its own process; its first step is its
line `hand-written first step done`. With `--compile-cache` it runs with JAX's cache in the
folder's sibling `<folder>-hand` (primed by one run, reported as its cold run) beside fitjax's warm
runs; without, cold. `--smoke` runs it once too (the tiny preset).
"""

from __future__ import annotations

import argparse
import os
import pty
import re
import select
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _results  # noqa: E402

_ROOT = Path(__file__).resolve().parent.parent
_ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")
_STEP_DONE = re.compile(rb"\b([1-9]\d*)/\d+\b")  # the bar's "completed/total" column past 0
_HAND_DONE = b"hand-written first step done"  # first_step_hand.py's line (its MARK)


def _path_with(root: Path) -> str:
    """PYTHONPATH with `root` first, the caller's entries kept (a machine's JAX may live there)."""
    return os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))


def one_run(root: Path, extra: list[str], env: dict[str, str] | None = None, epochs: int = 3,
            example: str = "digits.py", *, keep_jax_cache: bool = False) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as logs:
        schedule = ["--epochs", str(epochs)] if example == "digits.py" else []
        cmd = [sys.executable, str(root / "examples" / example), *schedule, "--root-dir", logs, *extra]
        return timed(cmd, root, {"FITJAX_COMPILE_CACHE": "0", **(env or {})}, keep_jax_cache=keep_jax_cache)


def hand_run(root: Path, preset: str, cache: Path | None, *, keep_jax_cache: bool = False) -> dict[str, float]:
    """One run of `first_step_hand.py` (the hand-written loop of the GPT example's model and step),
    JAX's compile cache in `cache` (None: off)."""
    cmd = [sys.executable, str(root / "benchmarks" / "first_step_hand.py"), "--preset", preset]
    return timed(cmd + (["--compile-cache", str(cache)] if cache else []), root, {}, keep_jax_cache=keep_jax_cache)


def timed(cmd: list[str], root: Path, env: dict[str, str], *, keep_jax_cache: bool = False) -> dict[str, float]:
    """Runs `cmd` in a pseudo-terminal; seconds from its start to its first output, its first step
    (the bar's counter past 0, or the hand-written loop's line) and its exit."""
    leader, follower = pty.openpty()
    caller = {k: v for k, v in os.environ.items() if keep_jax_cache or k != "JAX_COMPILATION_CACHE_DIR"}
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=follower, stderr=follower, cwd=root,
                            env={**caller, "COLUMNS": "160", "PYTHONPATH": _path_with(root), **env})
    os.close(follower)
    times: dict[str, float] = {}
    seen = b""
    while True:
        ready, _, _ = select.select([leader], [], [], 0.05)
        if ready:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the child closed the terminal
                chunk = b""
            if not chunk:
                break
            now = time.perf_counter() - start
            text = _ANSI.sub(b"", chunk)
            if text.strip() and "first output" not in times:
                times["first output"] = now
            seen = (seen + text)[-4096:]
            if "first step" not in times and (b"Epoch 0" in seen and _STEP_DONE.search(seen.split(b"Epoch 0")[-1])
                                              or _HAND_DONE in seen):
                times["first step"] = now
        elif proc.poll() is not None:
            break
    proc.wait()
    times["exit"] = time.perf_counter() - start
    os.close(leader)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed with exit code {proc.returncode}; its output ended:\n"
                         + seen.decode(errors="replace")[-3000:])
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--before", type=Path, help="another checkout, run alternately with this one")
    parser.add_argument("--compile-cache", type=Path,
                        help="also run with JAX's persistent compilation cache in this (new) folder, "
                             "primed by one run (reported as the cold run)")
    parser.add_argument("--smoke", action="store_true", help="1 run of 1 epoch: checks the script runs")
    parser.add_argument("--no-cold", action="store_true",
                        help="with --compile-cache: only the priming run (cold) and the warm ones")
    parser.add_argument("--example", default="digits.py", help="the example under examples/ (default digits.py)")
    parser.add_argument("--json", default=None, help="write every run's times here as JSON")
    parser.add_argument("--hand", action="store_true",
                        help="with --example gpt.py: also the hand-written loop of its model (first_step_hand.py, "
                             "the same --preset); with --compile-cache, its own cache warm")
    parser.add_argument("extra", nargs="*", help="arguments passed on to the example (after --)")
    args = parser.parse_args()
    if args.hand and args.example != "gpt.py":
        parser.error(f"--hand runs a hand-written loop of examples/gpt.py's model: it needs --example gpt.py, "
                     f"got --example {args.example}")
    epochs = 3  # the example's schedule warms up for 2 epochs
    keep = args.smoke  # the smoke keeps the caller's JAX cache (the test suite's: each program compiled once)
    if args.smoke:  # one run of one epoch: every line the script reads still comes
        args.runs, epochs = 1, 1

    def example(root: Path, env: dict[str, str]) -> Callable[[], dict[str, float]]:
        return lambda: one_run(root, args.extra, env, epochs, args.example, keep_jax_cache=keep)

    variants: dict[str, Callable[[], dict[str, float]]] = {} if args.no_cold else {"this": example(_ROOT, {})}
    if args.before:
        variants["before"] = example(args.before.resolve(), {})
    primings: dict[str, list[dict[str, float]]] = {}
    if args.compile_cache:
        cache = {"FITJAX_COMPILE_CACHE": str(args.compile_cache)}  # fitjax's cache, its defaults
        variants["this, warm compile cache"] = example(_ROOT, cache)
        primings["this, priming the compile cache (cold)"] = [_primed("the compile cache", variants[
            "this, warm compile cache"])]
    if args.hand or args.smoke:  # the smoke runs the tiny preset's, as a check that its line is read
        preset = "tiny" if args.smoke else _option(args.extra, "--preset", default="tiny")
        own = args.compile_cache.with_name(args.compile_cache.name + "-hand") if args.compile_cache else None
        variants["hand-written" + (", warm compile cache" if own else "")] = lambda: hand_run(
            _ROOT, preset, own, keep_jax_cache=keep)
        if own:
            primings["hand-written, priming its compile cache (cold)"] = [_primed(
                "the hand-written loop's compile cache", variants["hand-written, warm compile cache"])]
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    runs.update(primings)
    for i in range(args.runs):
        for name, run in variants.items():  # alternated, so a change in the machine's load hits all
            times = run()
            runs[name].append(times)
            print(f"{name} run {i}: " + "  ".join(f"{k} {v:.2f}s" for k, v in times.items()), flush=True)
    for name, results in runs.items():
        print(f"{name} median: " + "  ".join(
            f"{k} {statistics.median(r.get(k, float('nan')) for r in results):.2f}s"
            for k in ["first output", "first step", "exit"]))
    _results.record(args.json, {"example": args.example, "extra": args.extra, "runs": runs})


def _primed(what: str, run: Callable[[], dict[str, float]]) -> dict[str, float]:
    times = run()
    print(f"priming {what}: " + "  ".join(f"{k} {v:.2f}s" for k, v in times.items()), flush=True)
    return times


def _option(argv: list[str], name: str, *, default: str) -> str:
    """The value of `name` in the example's arguments (`--preset x` or `--preset=x`)."""
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return default


if __name__ == "__main__":
    main()
