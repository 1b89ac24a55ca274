"""Where the host's time goes per train step: the loop bare, each default, and a hand-written loop.

    python benchmarks/host_profile.py                 # the table and the per-step calls (~2 min)
    python benchmarks/host_profile.py --repeats 7     # steadier medians
    python benchmarks/host_profile.py --smoke         # every part once, tiny sizes: checks it runs
    python benchmarks/host_profile.py --steps-per-execution 32   # fitjax's rows per call of 32 steps

The workload is `benchmarks/overhead.py`'s tiny MLP (64-64-10, batch 32, 1024 steps an epoch) fed
by `fj.DataLoader`; its step is so small that the host's work per step shows. Two parts:

1. **CPU per step** (medians over `--repeats`, the configurations alternated in one process):
   the main thread's CPU time per step (`time.thread_time`: what the loop costs, little moved
   by other processes' load), the part of it inside the call of the compiled step (dispatch,
   and on XLA:CPU the small step's own execution, which runs on the calling thread), the rest
   (`loop`: everything fitjax or the hand loop does around the step), the whole process's CPU
   (other threads too: a logger's writer, Orbax) and the wall time per step. Rows: `hand` (the
   naive jitted loop over numpy batches the Flax docs teach), `unshuf` (the same loop on
   consecutive numpy slices: no shuffle, no gather; issue 62's simplest loop), `all off` (no progress bar,
   summary, logger or checkpoint), each default alone on top of that (`+bar`, `+logger`,
   `+ckpt`), and `defaults`.
2. **Python calls per step** (deterministic, load-independent): the function calls of one
   steady-state epoch counted with `sys.setprofile` (Python and C functions), divided by its
   steps, with the functions that make the difference of each configuration against `all off`.

Every run times epochs 1.. (epoch 0 compiles). The progress bar draws as on a terminal into a
discarded stream.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import os
import statistics
import sys
import tempfile
import time


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=3, help="including the warm-up epoch")
    parser.add_argument("--top", type=int, default=12, help="functions listed per configuration")
    parser.add_argument("--steps-per-execution", type=int, default=1, metavar="K",
                        help="fitjax's configurations only, with K steps a call of the step, and every figure "
                             "per call instead of per step (issue 62: the loop's host time per call with "
                             "`steps_per_execution`)")
    parser.add_argument("--smoke", action="store_true",
                        help="hand, unshuf, all off and defaults once each, 32-step epochs, calls counted in the same "
                             "runs: checks the script runs (its numbers mean nothing)")
    return parser


if __name__ == "__main__":  # --help (or a wrong argument) answered before JAX is imported
    _parser().parse_args()


import jax
import numpy as np
import optax
from flax.training import train_state

sys.path.insert(0, os.path.dirname(__file__))
import overhead  # noqa: E402  (the same workload, module and hand-written loop)

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import fitjax as fj  # noqa: E402

# configuration -> the defaults kept on (`overhead.DEFAULT_PARTS` names); None: the hand loop
CONFIGS = {
    "hand": None,
    "unshuf": None,  # the hand loop on consecutive numpy slices (no shuffle, no gather)
    "all off": (),
    "+bar": ("progress bar",),
    "+logger": ("logger",),
    "+ckpt": ("checkpoint",),
    "defaults": tuple(overhead.DEFAULT_PARTS),
}


class Clock:
    """Main-thread CPU, process CPU and wall clocks, read together."""

    @staticmethod
    def now() -> np.ndarray:
        return np.array([time.thread_time(), time.process_time(), time.perf_counter()])


class StepClock(fj.profilers.PassThroughProfiler):
    """Adds up the main thread's CPU time spent inside calls of the train step (nothing else)."""

    def __init__(self):
        super().__init__()
        self.spent = 0.0

    def wrap_step(self, step):
        def timed(*args):
            start = time.thread_time()
            out = step(*args)
            self.spent += time.thread_time() - start
            return out

        return timed


class Window(fj.Callback):
    """Measures epochs 1..: the clocks, the step-call time and optionally the Python calls."""

    def __init__(self, step_clock: StepClock, count_calls: bool):
        self.step_clock, self.count_calls = step_clock, count_calls
        self.calls: collections.Counter | None = None

    def on_train_epoch_start(self, trainer, module):
        if trainer.current_epoch == 1:
            jax.block_until_ready(trainer.state)
            self.start_step, self.step_clock.spent = trainer.global_step, 0.0
            if self.count_calls:
                self.calls = start_counting()
            self.start = Clock.now()

    def on_train_epoch_end(self, trainer, module):
        if trainer.current_epoch == trainer.max_epochs - 1:  # the last one (its means are fetched)
            jax.block_until_ready(trainer.state)
            self.result = Result(Clock.now() - self.start, self.step_clock.spent,
                                 trainer.global_step - self.start_step, stop_counting(self.calls))


class Result:
    def __init__(self, clocks, in_step: float, steps: int, calls: collections.Counter | None):
        self.thread, self.process, self.wall = clocks / steps * 1e6
        self.in_step = in_step / steps * 1e6
        self.calls = None if calls is None else {k: v / steps for k, v in calls.items()}

    @property
    def loop(self) -> float:
        return self.thread - self.in_step

    def per_call(self, steps: int) -> "Result":
        """These figures per call of `steps` steps instead of per step."""
        self.thread, self.process, self.wall, self.in_step = (
            x * steps for x in (self.thread, self.process, self.wall, self.in_step))
        self.calls = None if self.calls is None else {k: v * steps for k, v in self.calls.items()}
        return self


def start_counting() -> collections.Counter:
    calls: collections.Counter = collections.Counter()

    def count(frame, event, arg):
        if event == "call":
            code = frame.f_code
            calls[f"{_short(code.co_filename)}:{code.co_name}"] += 1
        elif event == "c_call":
            calls[f"<c> {getattr(arg, '__qualname__', arg)}"] += 1

    sys.setprofile(count)
    return calls


def stop_counting(calls):
    sys.setprofile(None)
    return calls


def _short(path: str) -> str:
    for marker in ("/fitjax/", "/site-packages/", "/benchmarks/"):
        if marker in path:
            return path.split(marker, 1)[1] if marker != "/fitjax/" else "fitjax/" + path.split(marker, 1)[1]
    return os.path.basename(path)


def run_fitjax(parts, data, steps_per_epoch, epochs, root, *, count_calls=False, **trainer_kwargs) -> Result:
    factory, _, batch_size, _ = overhead.WORKLOADS["tiny_mlp"]
    clock = StepClock()
    window = Window(clock, count_calls)
    callbacks = [window]
    if "progress bar" in parts:
        callbacks.append(fj.RichProgressBar(file=io.StringIO(), force_terminal=True))
    off = {flag: False for part, flag in overhead.DEFAULT_PARTS.items() if part not in parts}
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        trainer = fj.Trainer(max_epochs=epochs, callbacks=callbacks, default_root_dir=root, strategy="single",
                             profiler=clock, **{**off, **trainer_kwargs})
        trainer.fit(overhead.Classifier(factory()),
                    fj.DataLoader(data, batch_size=batch_size, shuffle=True, drop_last=True))
    return window.result


def run_hand(data, steps_per_epoch, epochs, *, count_calls=False, shuffle=True) -> Result:
    """`overhead.hand_written`'s loop, with the clocks and the step-call time."""
    factory, _, batch_size, _ = overhead.WORKLOADS["tiny_mlp"]
    model, n = factory(), len(data["y"])
    params = model.init(jax.random.key(0), data["x"][:batch_size])["params"]
    state = train_state.TrainState.create(apply_fn=model.apply, params=params, tx=optax.adam(1e-3))

    @jax.jit
    def train_step(state, batch):
        def loss_fn(params):
            return overhead.cross_entropy(state.apply_fn({"params": params}, batch["x"]), batch["y"])

        loss, grads = jax.value_and_grad(loss_fn)(state.params)
        return state.apply_gradients(grads=grads), loss

    in_step, calls = 0.0, None
    for epoch in range(epochs):
        if epoch == 1:
            jax.block_until_ready(state)
            calls = start_counting() if count_calls else None
            start = Clock.now()
        perm = np.random.default_rng(epoch).permutation(n) if shuffle else None
        for i in range(steps_per_epoch):
            if shuffle:
                idx = perm[i * batch_size:(i + 1) * batch_size]
                batch = {"x": data["x"][idx], "y": data["y"][idx]}
            else:
                batch = {"x": data["x"][i * batch_size:(i + 1) * batch_size],
                         "y": data["y"][i * batch_size:(i + 1) * batch_size]}
            t = time.thread_time()
            state, loss = train_step(state, batch)
            if epoch:
                in_step += time.thread_time() - t
    jax.block_until_ready(state)
    clocks = Clock.now() - start
    return Result(clocks, in_step, steps_per_epoch * (epochs - 1), stop_counting(calls))


def run(name, data, steps_per_epoch, epochs, root, *, count_calls=False, per_call: int = 1) -> Result:
    parts = CONFIGS[name]
    if parts is None:
        return run_hand(data, steps_per_epoch, epochs, count_calls=count_calls, shuffle=name == "hand")
    if per_call == 1:
        return run_fitjax(parts, data, steps_per_epoch, epochs, root, count_calls=count_calls)
    return run_fitjax(parts, data, steps_per_epoch, epochs, root, count_calls=count_calls,
                      steps_per_execution=per_call).per_call(per_call)


def main(argv=None):
    args = _parser().parse_args(argv)
    _, shape, batch_size, steps = overhead.WORKLOADS["tiny_mlp"]
    configs = list(CONFIGS)
    per_call = args.steps_per_execution
    if args.smoke:
        args.repeats, args.epochs, steps = 1, 2, 32
        configs = ["hand", "unshuf", "all off", "defaults"]
    if per_call > 1:  # the hand loops take one step a call: left out
        configs = [name for name in configs if CONFIGS[name] is not None]
    data = overhead.make_data(shape, batch_size * steps)
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}; tiny MLP, batch {batch_size}, {steps} steps an "
          f"epoch, {args.epochs - 1} timed epoch(s), {args.repeats} repeat(s); load average at start "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    results: dict[str, list[Result]] = {name: [] for name in configs}
    with tempfile.TemporaryDirectory() as root:
        for repeat in range(args.repeats):
            for name in configs if repeat % 2 == 0 else configs[::-1]:
                results[name].append(run(name, data, steps, args.epochs, root, count_calls=args.smoke,
                                         per_call=per_call))
        # counted in runs of their own (the counting slows every call down), except in the smoke run
        counted = ({name: runs[0] for name, runs in results.items()} if args.smoke else
                   {name: run(name, data, steps, 2, root, count_calls=True, per_call=per_call) for name in configs})
    print(f"load average at end {' '.join(f'{x:.2f}' for x in os.getloadavg())}\n")
    unit = "step" if per_call == 1 else f"call of {per_call} steps"
    print(f"µs per {unit} (medians)  main thread CPU = in the step call + loop;  process CPU;  wall;  "
          f"Python calls per {unit}")
    print(f"{'config':<10} {'thread':>8} {'in step':>8} {'loop':>8} {'process':>8} {'wall':>8} {'calls':>7}")
    med = lambda name, attr: statistics.median(getattr(r, attr) for r in results[name])  # noqa: E731
    for name in configs:
        print(f"{name:<10} {med(name, 'thread'):8.1f} {med(name, 'in_step'):8.1f} {med(name, 'loop'):8.1f} "
              f"{med(name, 'process'):8.1f} {med(name, 'wall'):8.1f} {sum(counted[name].calls.values()):7.1f}")
    base = counted["all off"].calls
    for name in configs:
        calls = counted[name].calls
        if name in ("all off", "hand", "unshuf"):
            top = sorted(calls.items(), key=lambda kv: -kv[1])[:args.top]
            print(f"\n{name}: the most called functions per {unit}")
        else:
            diff = {k: calls.get(k, 0) - base.get(k, 0) for k in set(calls) | set(base)}
            top = sorted(((k, v) for k, v in diff.items() if abs(v) >= 0.01), key=lambda kv: -abs(kv[1]))[:args.top]
            print(f"\n{name}: calls per {unit} against all off ({sum(diff.values()):+.1f})")
        for key, per_step in top:
            print(f"  {per_step:8.2f}  {key}")


if __name__ == "__main__":
    main()
