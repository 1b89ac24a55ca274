"""The host's cost of fetching log windows, per way of fetching them (issue 62, item 4).

A log window is the train metrics' accumulators of the steps since the last log step, taken out
of the state and replaced by zeros at a log step, then read on the host once the device has
computed them. With `steps_per_execution=32` and the default `log_every_n_steps=50` two calls in
three start one, and on a TPU chip each cost ~150 µs of host time (a cProfile of
`overhead.py --only spe`): the loop falls behind a hand-written scan, which logs nothing.

This script runs a host-bound loop of a small step program (a `lax.scan` of 32 tiny updates, its
state donated, as `steps_per_execution=32` compiles) and fetches windows like the loop does,
one way per row, reporting the host time a call and a window against the same loop without
windows:

- `async`: each window's accumulator is copied to the host when it is taken
  (`copy_to_host_async`), read when it has arrived (fitjax's way before batching);
- `sync`: no copy ahead: read (a blocking transfer) when the step that computed it has finished;
- `batchN`: windows are held on the device and, N at a time, stacked by one small program into
  one array, copied once and read once.

Usage: python benchmarks/window_fetch.py [--calls 3000] [--repeats 3] [--json FILE]
       python benchmarks/window_fetch.py --smoke    # every way once, a few calls: checks it runs
"""

from __future__ import annotations

import argparse
import collections
import json
import time


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ways", default="none,async,sync,batch4,batch8,batch16")
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--smoke", action="store_true", help="every way once, 90 calls: checks the script runs")
    return parser


if __name__ == "__main__":  # --help (or a wrong argument) answered before JAX is imported
    _parser().parse_args()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

WIDTH, STEPS = 64, 32
IN_FLIGHT = 4  # windows on their way at most (fitjax's `_IN_FLIGHT`)


def make_step():
    def step(state, xs):
        def one(carry, x):
            w, acc = carry
            loss = jnp.mean(jnp.tanh(x @ w) ** 2)
            w = w - 1e-3 * jax.grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w)
            return (w, acc + jnp.stack([loss, 1.0])), None

        (w, acc), _ = jax.lax.scan(one, (state["w"], state["acc"]), xs)
        return {"w": w, "acc": acc}

    return jax.jit(step, donate_argnums=0)


def zeros_ahead():
    return jax.jit(lambda: tuple(jnp.zeros((2,), jnp.float32) for _ in range(16)))


def run(way: str, calls: int) -> dict:
    step, make_zeros = make_step(), zeros_ahead()
    xs = jnp.ones((STEPS, 32, WIDTH), jnp.float32)
    state = {"w": jnp.eye(WIDTH, dtype=jnp.float32), "acc": jnp.zeros((2,), jnp.float32)}
    batch = int(way[5:]) if way.startswith("batch") else 0
    stack = jax.jit(lambda *leaves: jnp.stack(leaves)) if batch else None
    zeros: list = []
    queue: collections.deque = collections.deque()  # (array, windows in it)
    held: list = []  # windows not yet stacked (batchN)
    windows = read = 0

    def take(state):
        if not zeros:
            zeros.extend(make_zeros())
        return state["acc"], {"w": state["w"], "acc": zeros.pop()}

    def send(array, n):
        if way != "sync":
            array.copy_to_host_async()
        queue.append((array, n))

    def read_one():
        nonlocal read
        array, n = queue.popleft()
        np.asarray(array)
        read += n

    def loop(n_calls):
        nonlocal state, windows
        for i in range(n_calls):
            state = step(state, xs)
            while queue and queue[0][0].is_ready():
                read_one()
            if way == "none" or i % 3 == 0:
                continue
            acc, state = take(state)
            windows += 1
            if batch:
                held.append(acc)
                if len(held) == batch:
                    send(stack(*held), batch)
                    held.clear()
            else:
                send(acc, 1)
            while len(queue) > IN_FLIGHT:
                read_one()
        while queue:
            read_one()
        jax.block_until_ready(state)

    loop(60)  # compiles
    windows = read = 0
    wall, cpu = time.perf_counter(), time.process_time()
    loop(calls)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"way": way, "us_per_call": 1e6 * wall / calls, "cpu_us_per_call": 1e6 * cpu / calls,
            "windows": windows, "read": read}


def main() -> None:
    args = _parser().parse_args()
    if args.smoke:
        args.calls, args.repeats = 90, 1
    ways = args.ways.split(",")
    rows = {way: [] for way in ways}
    for _ in range(args.repeats):
        for way in ways:  # alternated: the machine's drift shared by every way
            rows[way].append(run(way, args.calls))
    base = min(r["us_per_call"] for r in rows["none"]) if "none" in rows else None
    print(f"{jax.devices()[0].device_kind}: {args.calls} calls of {STEPS} steps, a window at 2 calls in 3")
    summary = []
    for way in ways:
        best = min(rows[way], key=lambda r: r["us_per_call"])
        extra = None if base is None or not best["windows"] else (best["us_per_call"] - base) * args.calls / best["windows"]
        summary.append({**best, "us_per_window_over_none": extra})
        print(f"{way:>8}: {best['us_per_call']:7.1f} µs a call (cpu {best['cpu_us_per_call']:7.1f})"
              + ("" if extra is None else f", {extra:6.1f} µs a window over none"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": jax.devices()[0].device_kind, "rows": summary, "all": rows}, f, indent=1)


if __name__ == "__main__":
    main()
