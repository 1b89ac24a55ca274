"""Time to first output: how long `examples/digits.py` leaves a new user looking at nothing.

    python benchmarks/first_output.py              # 3 runs of `examples/digits.py --epochs 3`
    python benchmarks/first_output.py --smoke      # 1 run: checks it runs
    python benchmarks/first_output.py --runs 5 -- --strategy dp
    python benchmarks/first_output.py --before /tmp/old-checkout   # alternate runs of two checkouts
    python benchmarks/first_output.py --compile-cache /tmp/xla-cache  # and runs with a warm compile cache
    python benchmarks/first_output.py --example gpt.py --runs 1 --compile-cache /tmp/c -- --preset gpt2-small \
        --max-steps 30 --sample-length 0                  # the GPT example, cold and warm (a chip)

Runs the example in a pseudo-terminal (as a user's shell does, so the live bar is drawn) and reads
its output as it arrives. Reports, per run, seconds from process start to:
  - the first printed character,
  - the first training step completed (the bar's counter leaves 0/N),
  - the process exit.
Medians over the runs are printed last. `--example` runs another example (its options after `--`;
digits.py alone gets `--epochs 3`). Every run but the warm cache's has fitjax's compile cache off
(`FITJAX_COMPILE_CACHE=0`), so each compiles from scratch. The first run after a boot or a new install also pays for
cold file caches; later runs show the steady state.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _results  # noqa: E402

_ROOT = Path(__file__).resolve().parent.parent
_ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")
_STEP_DONE = re.compile(rb"\b([1-9]\d*)/\d+\b")  # the bar's "completed/total" column past 0


def _path_with(root: Path) -> str:
    """PYTHONPATH with `root` first, the caller's entries kept (a machine's JAX may live there)."""
    return os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))


def one_run(root: Path, extra: list[str], env: dict[str, str] | None = None, epochs: int = 3,
            example: str = "digits.py") -> dict[str, float]:
    leader, follower = pty.openpty()
    env = {"FITJAX_COMPILE_CACHE": "0", **(env or {})}
    with tempfile.TemporaryDirectory() as logs:
        schedule = ["--epochs", str(epochs)] if example == "digits.py" else []
        cmd = [sys.executable, str(root / "examples" / example), *schedule, "--root-dir", logs, *extra]
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=follower, stderr=follower, cwd=root,
                                env={**os.environ, "COLUMNS": "160", "PYTHONPATH": _path_with(root), **env})
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
                if "first step" not in times and b"Epoch 0" in seen and _STEP_DONE.search(seen.split(b"Epoch 0")[-1]):
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
    parser.add_argument("--smoke", action="store_true", help="1 run: checks the script runs")
    parser.add_argument("--no-cold", action="store_true",
                        help="with --compile-cache: only the priming run (cold) and the warm ones")
    parser.add_argument("--example", default="digits.py", help="the example under examples/ (default digits.py)")
    parser.add_argument("--json", default=None, help="write every run's times here as JSON")
    parser.add_argument("extra", nargs="*", help="arguments passed on to the example (after --)")
    args = parser.parse_args()
    epochs = 3  # the example's schedule warms up for 2 epochs
    if args.smoke:
        args.runs = 1
    variants: dict[str, tuple[Path, dict[str, str]]] = {} if args.no_cold else {"this": (_ROOT, {})}
    if args.before:
        variants["before"] = (args.before.resolve(), {})
    if args.compile_cache:
        cache = {"FITJAX_COMPILE_CACHE": str(args.compile_cache)}  # fitjax's cache, its defaults
        variants["this, warm compile cache"] = (_ROOT, cache)
        primed = one_run(_ROOT, args.extra, cache, epochs, args.example)
        print("priming the compile cache: " + "  ".join(f"{k} {v:.2f}s" for k, v in primed.items()), flush=True)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    if args.compile_cache:
        runs["this, priming the compile cache (cold)"] = [primed]
    for i in range(args.runs):
        for name, (root, env) in variants.items():  # alternated, so a change in the machine's load hits all
            times = one_run(root, args.extra, env, epochs, args.example)
            runs[name].append(times)
            print(f"{name} run {i}: " + "  ".join(f"{k} {v:.2f}s" for k, v in times.items()), flush=True)
    for name, results in runs.items():
        print(f"{name} median: " + "  ".join(
            f"{k} {statistics.median(r.get(k, float('nan')) for r in results):.2f}s"
            for k in ["first output", "first step", "exit"]))
    _results.record(args.json, {"example": args.example, "extra": args.extra, "runs": runs})

if __name__ == "__main__":
    main()
