"""fitjax against hand-written Flax/Optax loops, in one process, on the same model and data.

    python benchmarks/overhead.py                    # every row below (a few minutes on 2 cores)
    python benchmarks/overhead.py --only defaults    # one group of rows
    python benchmarks/overhead.py --smoke            # every row, tiny sizes, seconds: checks it runs

Rows (each a ratio of steps/s, the median over `--repeats` of per-repeat ratios, runs alternated
so drifts in machine load hit both sides, with the lowest and highest of those ratios; the steps/s
columns are the medians over the repeats, so they agree with the ratio up to the pairing):

- `tiny` (first: the case users start with): the tiny MLP (64-64-10, batch 32, 1024-step epochs)
  fed by `fj.DataLoader`, against the naive hand-written loop the Flax docs teach (`@jax.jit`
  step, numpy batches sliced from a shuffled array) on the same data: fitjax with its defaults
  (progress bar, model summary, TensorBoard, a checkpoint per epoch; target >= 0.95), with one of
  them off (`bar off`, `logger off`, `ckpt off`), with all of them off (target >= 1.05: fitjax
  keeps the data on the device and donates the state); the same five rows against the simplest
  hand loop (`naive, unshuffled`: the jitted step called on consecutive numpy slices, no
  shuffle, no donation; targets >= 1.0, all off >= 1.1: issue 62), and `steps_per_execution=32` with all off
  against a raw `lax.scan` of 32 steps a call (target >= 0.95). Then the µs per step each default
  costs (the defaults' time per step less that with the default off; target <= 3% each), in wall
  time and in the main thread's CPU time (`time.thread_time`: what the loop itself costs, little
  moved by other processes' load; the wall time on a loaded machine is not), each the median of
  the per-repeat differences with their range. Before the repeats one untimed run of each kind
  warms the process (imports, thread pools, first-use caches), and every run times the same
  epochs (`--epochs`, at least 5 here: 4 timed after the compiling one).
- `clip`: `gradient_clip_val=1.0` against the unclipped run (tiny MLP, progress bar, logger,
  summary and checkpointing off). Target >= 0.95. `clip/hand`: the same clipped fits against
  the hand-written naive loop with `optax.clip_by_global_norm(1.0)` chained before Adam (target
  >= 1.0, as the defaults rows).
- `ema`: `callbacks=[fj.EMA(decay=0.999)]` (the average updated inside the step) against the same
  fit without it (MNIST-sized MLP, defaults off). Target >= 0.95.
- `spe`: `steps_per_execution=32` (tiny MLP, defaults off) against three hand-written loops of
  one `lax.scan` of 32 steps per call, the data on the device: `spe=32` gathers each step's batch
  with `jnp.take` inside the scan (target >= 0.8); `spe/shuf` gathers each epoch's shuffled
  batches on the device in one call and each call picks its 32 (the work fitjax does; target
  >= 0.9); `spe/dev` reuses batches gathered once before timing (no per-epoch work: the step
  program and its dispatch alone, the limit; target >= 0.9). `spe/wait`: against the same fit
  with an `on_train_epoch_end` hook that does nothing, where the loop waits for the epoch's
  means (what each epoch's end cost before they were read when next needed; target >= 1.0).
- `defaults`: fitjax with its defaults (progress bar, model summary, TensorBoard, a checkpoint
  per epoch) against the naive hand-written loop the Flax docs teach (`@jax.jit` step, numpy
  batches sliced from a shuffled array): the tiny MLP with 1024-step epochs (target >= 0.9), an
  MNIST-sized MLP 784-256-256-10 with batches of 128 and a small CNN (targets >= 1.0). The
  `no defaults` column is the same fit with all of them off. With `--device` these rows time at
  least 300 steps (the small CNN's 30-step epochs take ~25 ms on a TPU chip).
- `parts` (only with `--only parts`, and in `--smoke`): each default alone (the progress bar, the
  model summary, the TensorBoard logger, the default checkpoint: rows `+bar`, `+summary`, `+tb`,
  `+ckpt`) against the fit with none of them, on the tiny and the MNIST-sized MLP: which default
  costs what (target >= 0.95 each).

Every run is timed in steady state: epoch 0 (compilation) is a warm-up. fitjax's progress bar
draws as on a terminal into a discarded stream, and its other output is discarded too, so the
table below stays readable; the numbers include the cost of drawing. The load average is printed
at the start and the end: on a loaded machine compare the ratios, never the steps/s of two runs.
Without a GPU plugin installed JAX runs on the CPU here (`JAX_PLATFORMS=cpu` unless set): libtpu,
when installed, would otherwise probe for a TPU at start-up. `--device` leaves the platform to JAX
(on a TPU machine: the chip), and `--json PATH` writes every row's figures.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import io
import os
import statistics
import sys
import tempfile
import time

from _workload_names import WORKLOAD_NAMES


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=("tiny", "clip", "ema", "spe", "defaults", "parts"), action="append",
                        help="run only these rows (repeatable)")
    parser.add_argument("--epochs", type=int, default=3,
                        help="including one warm-up epoch (the clip and spe rows run at least 6: their "
                             "tiny-MLP epochs last ~0.1 s)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", action="store_true", help="run where JAX finds a device (a TPU, a GPU)")
    parser.add_argument("--json", default=None, help="write every row's figures here as JSON")
    parser.add_argument("--trace", default=None, metavar="FOLDER",
                        help="with the spe rows: after them, trace one steady epoch of fitjax's spe fit and of "
                             "the hand scan over batches on the device (jax.profiler, into FOLDER) and print "
                             "each side's programs on the device: count, device time, idle share")
    parser.add_argument("--smoke", action="store_true",
                        help="the tiny MLP only, 64-step epochs, 1 repeat: checks the script runs in seconds "
                             "(its numbers mean nothing)")
    return parser


if __name__ == "__main__":  # --help (or a wrong argument) answered before JAX is imported
    _parser().parse_args()


if "JAX_PLATFORMS" not in os.environ and "--device" not in sys.argv and not any(
        importlib.util.find_spec(plugin) for plugin in ("jax_cuda12_plugin", "jax_cuda13_plugin")):
    os.environ["JAX_PLATFORMS"] = "cpu"  # no TPU probe at start-up (libtpu is in the dev extra)

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training import train_state

import _results  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import fitjax as fj  # noqa: E402


class MLP(nn.Module):
    widths: tuple[int, ...]

    @nn.compact
    def __call__(self, x):
        x = x.reshape(x.shape[0], -1)
        for w in self.widths[:-1]:
            x = nn.relu(nn.Dense(w)(x))
        return nn.Dense(self.widths[-1])(x)


class CNN(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(32, (3, 3))(x))
        x = nn.max_pool(x, (2, 2), (2, 2))
        x = nn.relu(nn.Conv(64, (3, 3))(x))
        x = nn.max_pool(x, (2, 2), (2, 2))
        x = x.reshape(x.shape[0], -1)
        x = nn.relu(nn.Dense(256)(x))
        return nn.Dense(10)(x)


WORKLOADS = {
    # name: (model factory, input shape, batch size, steps per epoch)
    "tiny_mlp": (lambda: MLP((64, 64, 10)), (64,), 32, 1024),
    "mnist_mlp": (lambda: MLP((256, 256, 10)), (784,), 128, 300),
    "small_cnn": (lambda: CNN(), (28, 28, 1), 128, 30),
}
assert tuple(sorted(WORKLOADS)) == WORKLOAD_NAMES  # what peers.py and techniques.py offer


def make_data(shape, n, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, *shape)).astype(np.float32)
    y = rng.integers(0, 10, size=(n,)).astype(np.int32)
    return {"x": x, "y": y}


def cross_entropy(logits, labels):
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


class Timing(float):
    """One run's steady-state steps/s (wall clock; a float, as the other scripts use it), with
    `cpu_us`: the main thread's CPU µs per step."""

    def __new__(cls, rate: float, cpu_us: float) -> Timing:
        timing = super().__new__(cls, rate)
        timing.cpu_us = cpu_us
        return timing


def _clocks() -> tuple[float, float]:
    return time.perf_counter(), time.thread_time()


def _timing(start: tuple[float, float], steps: int) -> Timing:
    wall, cpu = (now - then for now, then in zip(_clocks(), start))
    return Timing(steps / wall, cpu / steps * 1e6)


# ----------------------------------------------------------------------------- hand-written loop


def hand_written(model, data, batch_size, epochs, tx=None, *, shuffle: bool = True) -> Timing:
    """The steady state of the Flax-docs loop (epoch 0 is the warm-up); `tx` defaults to
    `optax.adam(1e-3)`. `shuffle=False`: the simplest loop of all, the step called on
    consecutive numpy slices of the arrays (views: no copy, no gather), no donation."""
    n = len(data["y"])
    params = model.init(jax.random.key(0), data["x"][:batch_size])["params"]
    tx = optax.adam(1e-3) if tx is None else tx
    state = train_state.TrainState.create(apply_fn=model.apply, params=params, tx=tx)

    @jax.jit
    def train_step(state, batch):
        def loss_fn(params):
            logits = state.apply_fn({"params": params}, batch["x"])
            return cross_entropy(logits, batch["y"])

        loss, grads = jax.value_and_grad(loss_fn)(state.params)
        return state.apply_gradients(grads=grads), loss

    steps = n // batch_size
    start = None
    for epoch in range(epochs):
        if epoch == 1:
            jax.block_until_ready(state)
            start = _clocks()
        if not shuffle:
            x, y = data["x"], data["y"]
            for i in range(steps):
                state, loss = train_step(state, {"x": x[i * batch_size:(i + 1) * batch_size],
                                                 "y": y[i * batch_size:(i + 1) * batch_size]})
            continue
        perm = np.random.default_rng(epoch).permutation(n)
        for i in range(steps):
            idx = perm[i * batch_size:(i + 1) * batch_size]
            batch = {"x": data["x"][idx], "y": data["y"][idx]}
            state, loss = train_step(state, batch)
    jax.block_until_ready(state)
    return _timing(start, steps * (epochs - 1))


# ----------------------------------------------------------------------------------- fitjax


class Classifier(fj.LitModule):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def loss(self, model, batch):
        return cross_entropy(model(batch["x"]), batch["y"])

    def configure_optimizer(self):
        return optax.adam(1e-3)


class SteadyStateTimer(fj.Callback):
    """Times epochs 1.. (epoch 0 compiles). Epoch hooks only: adds no per-step work. Like the
    compile, the warm-up epoch's checkpoint is finished before the clock starts: on an
    accelerator the default checkpoint writes it beside the loop, and a 30-step epoch of the
    small CNN (~25 ms on a TPU chip) would otherwise time that one-off write (0.45x)."""

    def on_train_epoch_start(self, trainer, module):
        if trainer.current_epoch == 1:
            jax.block_until_ready(trainer.state)
            fj.checkpoint.writer().wait()
            self.start, self.start_step = _clocks(), trainer.global_step

    def on_train_end(self, trainer, module):
        jax.block_until_ready(trainer.state)
        self.timing = _timing(self.start, trainer.global_step - self.start_step)


class TraceEpoch(fj.Callback):
    """Traces epoch 1 (a steady one, after the compiles) with `jax.profiler` into `folder`."""

    def __init__(self, folder: str):
        self.folder = folder

    def on_train_epoch_start(self, trainer, module):
        if trainer.current_epoch == 1:
            jax.block_until_ready(trainer.state)
            jax.profiler.start_trace(self.folder)

    def on_train_epoch_end(self, trainer, module):
        if trainer.current_epoch == 1:
            jax.block_until_ready(trainer.state)
            jax.profiler.stop_trace()


class EpochEndHook(fj.Callback):
    """An `on_train_epoch_end` that does nothing: the loop writes the epoch's means before it, so
    it waits for them (as it did at every epoch's end before issue 62)."""

    def on_train_epoch_end(self, trainer, module):
        pass


# each default's name -> the Trainer flag that turns it off
DEFAULT_PARTS = {"progress bar": "enable_progress_bar", "summary": "enable_model_summary", "logger": "logger",
                 "checkpoint": "enable_checkpointing"}


def with_fitjax(model, data, batch_size, epochs, root, *, module_cls=Classifier, defaults=True,
                extra_callbacks=(), **trainer_kwargs) -> Timing:
    """The steady state of `Trainer.fit`; `defaults=False` turns off the progress bar, the
    model summary, the logger and checkpointing, a tuple of `DEFAULT_PARTS` names keeps those on."""
    parts = tuple(DEFAULT_PARTS) if defaults is True else tuple(defaults or ())
    timer = SteadyStateTimer()
    sink = io.StringIO()
    callbacks = [timer, *extra_callbacks]
    if "progress bar" in parts:  # drawn as on a terminal, into a stream nobody reads
        callbacks.append(fj.RichProgressBar(file=sink, force_terminal=True))
    trainer_kwargs = {**{flag: False for part, flag in DEFAULT_PARTS.items() if part not in parts},
                      **trainer_kwargs}
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        trainer = fj.Trainer(max_epochs=epochs, callbacks=callbacks, default_root_dir=root, strategy="single",
                             **trainer_kwargs)
        trainer.fit(module_cls(model), fj.DataLoader(data, batch_size=batch_size, shuffle=True, drop_last=True))
    return timer.timing


DEVICE_TIMED_STEPS = 300  # with --device: the defaults rows time at least this many steps


def _defaults_epochs(args, steps_per_epoch: int) -> int:
    """The defaults rows' epochs, the warm-up one included: `--epochs`, and with `--device` enough
    to time `DEVICE_TIMED_STEPS` steps. On a TPU chip the small CNN's 30-step epoch takes ~25 ms,
    so two timed epochs were one save's write long, and every epoch end is a default
    checkpoint's decision to time."""
    if args.smoke or not args.device:
        return args.epochs
    return max(args.epochs, 1 - (-DEVICE_TIMED_STEPS // steps_per_epoch))


def hand_written_scan(model, data, batch_size, epochs, k) -> Timing:
    """Steady-state steps/s (with the main thread's CPU per step) of a hand-written loop running
    `k` steps per call (`lax.scan`), the data on the device and each call's batches gathered
    there from the epoch's permutation."""
    n = len(data["y"])
    params = model.init(jax.random.key(0), data["x"][:batch_size])["params"]
    state = train_state.TrainState.create(apply_fn=model.apply, params=params, tx=optax.adam(1e-3))
    on_device = jax.device_put(data)

    @functools.partial(jax.jit, donate_argnums=0)
    def k_steps(state, data, rows):  # rows: [k, batch_size] indices into the data
        def one(state, idx):
            batch = jax.tree.map(lambda a: jnp.take(a, idx, axis=0), data)

            def loss_fn(params):
                return cross_entropy(state.apply_fn({"params": params}, batch["x"]), batch["y"])

            loss, grads = jax.value_and_grad(loss_fn)(state.params)
            return state.apply_gradients(grads=grads), loss

        return jax.lax.scan(one, state, rows)

    calls = n // batch_size // k
    start = None
    for epoch in range(epochs):
        if epoch == 1:
            jax.block_until_ready(state)
            start = _clocks()
        perm = np.random.default_rng(epoch).permutation(n)[:calls * k * batch_size]
        rows = jax.device_put(perm.reshape(calls, k, batch_size).astype(np.int32))
        for i in range(calls):
            state, _ = k_steps(state, on_device, rows[i])
    jax.block_until_ready(state)
    return _timing(start, calls * k * (epochs - 1))


def hand_written_device_scan(model, data, batch_size, epochs, k, *, reshuffle: bool,
                             trace: str | None = None) -> Timing:
    """Steady-state steps/s (with the main thread's CPU per step) of the fastest hand-written
    loop of `k` steps per call: the batches
    already on the device, each call one `lax.scan` over its `k` batches picked there (a dynamic
    index: no gather inside the step). `reshuffle`: each epoch's shuffled batches are gathered on
    the device in one call, the work fitjax does too; otherwise they are gathered once before
    timing and every epoch reuses that order (the limit: the step program and its dispatch).
    `trace`: a folder where epoch 1 is traced (`jax.profiler`)."""
    n = len(data["y"])
    params = model.init(jax.random.key(0), data["x"][:batch_size])["params"]
    state = train_state.TrainState.create(apply_fn=model.apply, params=params, tx=optax.adam(1e-3))
    on_device = jax.device_put(data)
    calls = n // batch_size // k

    @jax.jit
    def gather(data, perm):  # perm: [calls * k * batch_size] rows of one epoch
        return jax.tree.map(lambda a: jnp.take(a, perm, axis=0).reshape(calls, k, batch_size, *a.shape[1:]), data)

    @functools.partial(jax.jit, donate_argnums=0)
    def k_steps(state, batches, i):  # batches: [calls, k, batch_size, ...]
        def one(state, batch):
            def loss_fn(params):
                return cross_entropy(state.apply_fn({"params": params}, batch["x"]), batch["y"])

            loss, grads = jax.value_and_grad(loss_fn)(state.params)
            return state.apply_gradients(grads=grads), loss

        return jax.lax.scan(one, state, jax.tree.map(lambda a: a[i], batches))

    def epoch_batches(epoch):
        perm = np.random.default_rng(epoch).permutation(n)[:calls * k * batch_size]
        return gather(on_device, jax.device_put(perm.astype(np.int32)))

    fixed = None if reshuffle else jax.block_until_ready(epoch_batches(0))
    start = None
    for epoch in range(epochs):
        if epoch == 1:
            jax.block_until_ready(state)
            start = _clocks()
            if trace:
                jax.profiler.start_trace(trace)
        batches = epoch_batches(epoch) if reshuffle else fixed
        for i in range(calls):
            state, _ = k_steps(state, batches, np.int32(i))
        if epoch == 1 and trace:
            jax.block_until_ready(state)
            jax.profiler.stop_trace()
    jax.block_until_ready(state)
    return _timing(start, calls * k * (epochs - 1))


def traced_spe(folder: str, factory, data, batch_size: int, root: str, spe: int) -> None:
    """One steady epoch of fitjax's `steps_per_execution` fit and of the hand scan over batches
    on the device, each traced: per side the programs the device ran (name, count, device
    milliseconds) and its idle share over the epoch, so a gap is placed on the device (a longer
    program) or on the host (idle time between programs)."""
    from _trace import device_lane_named, idle_of

    sides = {"fitjax": os.path.join(folder, "fitjax"), "hand": os.path.join(folder, "hand")}
    with_fitjax(factory(), data, batch_size, 2, root, defaults=False, steps_per_execution=spe,
                extra_callbacks=[TraceEpoch(sides["fitjax"])])
    hand_written_device_scan(factory(), data, batch_size, 2, spe, reshuffle=True, trace=sides["hand"])
    summary = {}
    for side, path in sides.items():
        programs = device_lane_named(path)
        idle = idle_of([(start, end) for _, start, end in programs])
        per_name: dict[str, list[float]] = {}
        for name, start, end in programs:
            per_name.setdefault(name, []).append(end - start)
        summary[side] = {"idle": idle, "programs": {name: {"count": len(d), "device_ms": sum(d) / 1e3}
                                                    for name, d in per_name.items()}}
        if idle is None:
            print(f"trace    {side}: no device lane (a CPU run)", flush=True)
            continue
        listed = ", ".join(f"{name} x{p['count']} {p['device_ms']:.2f} ms"
                           for name, p in sorted(summary[side]["programs"].items(), key=lambda kv: -kv[1]["device_ms"]))
        print(f"trace    {side}: epoch {idle['window_s'] * 1e3:.2f} ms, device busy {idle['busy_s'] * 1e3:.2f} ms "
              f"(idle {idle['idle_share']:.1%}); {listed}", flush=True)
    ROWS.append({"row": "spe trace", "sides": summary})


def median_ratio(runs: list[float], base: list[float]) -> float:
    """The median over repeats of `runs[i] / base[i]` (each run against its repeat's baseline)."""
    return statistics.median(r / b for r, b in zip(runs, base))


def _cpu(runs: list[float]) -> str:
    """The median main-thread CPU µs per step of `runs` ("-" for runs not timed so)."""
    cpu = [getattr(r, "cpu_us", None) for r in runs]
    return "-" if None in cpu else f"{statistics.median(cpu):.0f}"


def _row(name: str, workload: str, runs: list[float], base: list[float], base_name: str, target: float) -> str:
    """A row: the median steps/s of each side, the median of the per-repeat ratios with their
    range, the verdict, and the main thread's CPU µs per step of each side (medians)."""
    ratios = [r / b for r, b in zip(runs, base)]
    ratio = statistics.median(ratios)
    verdict = "ok" if ratio >= target else "BELOW"
    ROWS.append({"row": name, "workload": workload, "against": base_name, "steps_per_s": runs, "base_steps_per_s": base,
                 "ratio": ratio, "ratios": ratios, "target": target, "verdict": verdict})
    return (f"{name:<10} {workload:<10} {statistics.median(runs):>9.0f} {statistics.median(base):>9.0f}  "
            f"{base_name:<22} {ratio:>5.2f}x [{min(ratios):.2f}-{max(ratios):.2f}] "
            f"{'>= ' + format(target, '.2f'):>8}  {verdict:<5}  {_cpu(runs):>5}/{_cpu(base):<5}")


ROWS: list[dict] = []  # every printed row's figures, for --json

HEADER = (f"{'row':<10} {'workload':<10} {'fitjax/s':>9} {'base/s':>9}  {'against':<22} {'ratio [range]':<19}"
          f"{'target':>8}         cpu µs/step")


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


# the `tiny` rows: name -> the defaults kept on (None: the hand-written loop)
TINY_RUNS = {"hand": None, "unshuffled": None, "defaults": tuple(DEFAULT_PARTS),
             **{f"{part.split()[-1] if part != 'checkpoint' else 'ckpt'} off":
                tuple(p for p in DEFAULT_PARTS if p != part) for part in ("progress bar", "logger", "checkpoint")},
             "all off": ()}


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):+.1f} [{min(values):+.1f}..{max(values):+.1f}]"


def tiny_rows(args, workload, root, spe: int) -> None:
    """The `tiny` rows: each of `TINY_RUNS` and the spe pair, alternated in every repeat, after one
    untimed run of each kind (the first run in a process pays for imports and first-use caches)."""
    factory, data, batch_size = workload
    epochs = args.epochs if args.smoke else max(args.epochs, 5)  # the same timed epochs for every run
    runs = {name: [] for name in (*TINY_RUNS, "spe", "scan")}

    def run(name):
        if name in ("hand", "unshuffled"):
            return hand_written(factory(), data, batch_size, epochs, shuffle=name == "hand")
        if name == "spe":
            return with_fitjax(factory(), data, batch_size, epochs, root, defaults=False, steps_per_execution=spe)
        if name == "scan":
            return hand_written_scan(factory(), data, batch_size, epochs, spe)
        return with_fitjax(factory(), data, batch_size, epochs, root, defaults=TINY_RUNS[name])

    # the process's warm-up, not timed
    for name in () if args.smoke else ("hand", "unshuffled", "defaults", "spe", "scan"):
        run(name)
    for repeat in range(args.repeats):
        order = list(runs) if repeat % 2 == 0 else list(runs)[::-1]
        for name in order:
            runs[name].append(run(name))
    for name, target in (("defaults", 0.95), ("bar off", 0.95), ("logger off", 0.95), ("ckpt off", 0.95),
                         ("all off", 1.05)):
        print(_row(name, "tiny_mlp", runs[name], runs["hand"], "hand-written naive", target), flush=True)
    # the simplest hand loop (issue 62): no shuffle, so no gather per batch; fitjax shuffles
    for name, target in (("defaults", 1.0), ("bar off", 1.0), ("logger off", 1.0), ("ckpt off", 1.0),
                         ("all off", 1.1)):
        print(_row(name, "tiny_mlp", runs[name], runs["unshuffled"], "naive, unshuffled", target), flush=True)
    print(_row("spe=32", "tiny_mlp", runs["spe"], runs["scan"], "hand lax.scan of 32", 0.95), flush=True)
    # a default's cost: the defaults' time per step less that with the default off, per repeat,
    # in wall time and in the main thread's CPU time (the loop's own work, steadier under load)
    wall = statistics.median(1e6 / r for r in runs["defaults"])
    cpu = statistics.median(r.cpu_us for r in runs["defaults"])
    print(f"tiny: each default's cost a step, median [range] over {args.repeats} repeats (target <= 3% of the "
          f"defaults' {wall:.0f} µs wall, {cpu:.0f} µs CPU):", flush=True)
    for name in ("bar off", "logger off", "ckpt off", "all off"):
        walls = [1e6 / d - 1e6 / o for d, o in zip(runs["defaults"], runs[name])]
        cpus = [d.cpu_us - o.cpu_us for d, o in zip(runs["defaults"], runs[name])]
        what = "all four" if name == "all off" else name.removesuffix(" off")
        print(f"  {what:<9} wall {_spread(walls)} µs ({statistics.median(walls) / wall:+.1%}),  "
              f"CPU {_spread(cpus)} µs ({statistics.median(cpus) / cpu:+.1%})", flush=True)


def main(argv=None):
    args = _parser().parse_args(argv)
    workloads = dict(WORKLOADS)
    defaults_on = (("tiny_mlp", 0.9), ("mnist_mlp", 1.0), ("small_cnn", 1.0))
    if args.smoke:  # every row's code path once, on the tiny MLP only
        args.repeats, args.epochs = 1, 2
        factory, shape, batch, _ = WORKLOADS["tiny_mlp"]
        workloads = {"tiny_mlp": (factory, shape, batch, 64)}
        defaults_on = defaults_on[:1]
    # `parts` (20 more fits per workload) runs when asked for, and in the smoke run
    rows = args.only or ["tiny", "clip", "ema", "spe", "defaults", *(["parts"] if args.smoke else [])]
    spe = 32
    short = args.epochs if args.smoke else max(args.epochs, 6)
    tiny = args.epochs if args.smoke else max(args.epochs, 5)
    print(f"jax {jax.__version__} on {jax.devices()[0].platform} ({jax.device_count()} device(s)); "
          f"{args.repeats} repeats; timed epochs after a warm-up one: {tiny - 1} (tiny), {short - 1} (clip, spe), "
          f"{args.epochs - 1}{f' or {DEVICE_TIMED_STEPS}+ steps' if args.device and not args.smoke else ''} "
          f"(defaults); load average {_load()}", flush=True)
    print(HEADER, flush=True)
    with tempfile.TemporaryDirectory() as root:
        def data_for(name):
            factory, shape, batch_size, steps = workloads[name]
            return factory, make_data(shape, batch_size * steps), batch_size

        if "tiny" in rows:
            tiny_rows(args, data_for("tiny_mlp"), root, spe)
        if "clip" in rows:
            factory, data, batch_size = data_for("tiny_mlp")
            plain, clipped = [], []
            for repeat in range(args.repeats):  # which runs first alternates too: the second run
                runs = [(plain, {}), (clipped, {"gradient_clip_val": 1.0})]  # measured slower here
                for results, kwargs in (runs if repeat % 2 == 0 else runs[::-1]):
                    results.append(with_fitjax(factory(), data, batch_size, short, root, defaults=False, **kwargs))
            print(_row("clip", "tiny_mlp", clipped, plain, "unclipped fitjax", 0.95), flush=True)
            # Clipped against clipped: fitjax's clipped fits against the hand-written naive loop
            # with `optax.clip_by_global_norm(1.0)` chained before Adam, run in the same repeats.
            hand_clipped = []
            clipped_adam = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-3))
            for _ in range(args.repeats):
                hand_clipped.append(hand_written(factory(), data, batch_size, short, tx=clipped_adam))
            print(_row("clip/hand", "tiny_mlp", clipped, hand_clipped, "hand-written clipped", 1.0), flush=True)
        if "ema" in rows:
            name = "tiny_mlp" if args.smoke else "mnist_mlp"
            factory, data, batch_size = data_for(name)
            plain, averaged = [], []
            for _ in range(args.repeats):
                plain.append(with_fitjax(factory(), data, batch_size, args.epochs, root, defaults=False))
                averaged.append(with_fitjax(factory(), data, batch_size, args.epochs, root, defaults=False,
                                            extra_callbacks=[fj.EMA(decay=0.999)]))
            print(_row("ema", name, averaged, plain, "fitjax without EMA", 0.95), flush=True)
        if "spe" in rows:
            factory, data, batch_size = data_for("tiny_mlp")
            scan, shuffled, fixed, fit, waited = [], [], [], [], []
            for repeat in range(args.repeats):
                runs = [(fit, lambda: with_fitjax(factory(), data, batch_size, short, root, defaults=False,
                                                  steps_per_execution=spe)),
                        (waited, lambda: with_fitjax(factory(), data, batch_size, short, root, defaults=False,
                                                     steps_per_execution=spe, extra_callbacks=[EpochEndHook()])),
                        (scan, lambda: hand_written_scan(factory(), data, batch_size, short, spe)),
                        (shuffled, lambda: hand_written_device_scan(factory(), data, batch_size, short, spe,
                                                                    reshuffle=True)),
                        (fixed, lambda: hand_written_device_scan(factory(), data, batch_size, short, spe,
                                                                 reshuffle=False))]
                for results, run in (runs if repeat % 2 == 0 else runs[::-1]):
                    results.append(run())
            print(_row("spe=32", "tiny_mlp", fit, scan, "scan, take in the step", 0.8), flush=True)
            print(_row("spe/shuf", "tiny_mlp", fit, shuffled, "scan, epoch on device", 0.9), flush=True)
            print(_row("spe/dev", "tiny_mlp", fit, fixed, "scan, batches on dev.", 0.9), flush=True)
            print(_row("spe/wait", "tiny_mlp", fit, waited, "fitjax, epoch end hook", 1.0), flush=True)
            if args.trace:
                traced_spe(args.trace, factory, data, batch_size, root, spe)
        if "defaults" in rows:
            for name, target in defaults_on:
                factory, data, batch_size = data_for(name)
                epochs = _defaults_epochs(args, workloads[name][3])
                hand, bare, full = [], [], []
                for _ in range(args.repeats):
                    hand.append(hand_written(factory(), data, batch_size, epochs))
                    bare.append(with_fitjax(factory(), data, batch_size, epochs, root, defaults=False))
                    full.append(with_fitjax(factory(), data, batch_size, epochs, root))
                print(_row("defaults", name, full, hand, "hand-written naive", target), flush=True)
                print(_row("no dflts", name, bare, hand, "hand-written naive", target), flush=True)
        if "parts" in rows:  # each default alone against none of them, alternating
            for name, _ in defaults_on[:2]:
                factory, data, batch_size = data_for(name)
                runs = {part: [] for part in ("none", *DEFAULT_PARTS)}
                for repeat in range(args.repeats):
                    order = list(runs) if repeat % 2 == 0 else list(runs)[::-1]
                    for part in order:
                        runs[part].append(with_fitjax(factory(), data, batch_size, args.epochs, root,
                                                      defaults=() if part == "none" else (part,)))
                for part, label in zip(DEFAULT_PARTS, ("+bar", "+summary", "+tb", "+ckpt")):
                    print(_row(label, name, runs[part], runs["none"], "fitjax, no defaults", 0.95), flush=True)
    print(f"load average at the end {_load()}", flush=True)
    _results.record(args.json, {"repeats": args.repeats, "epochs": args.epochs, "rows": ROWS})


if __name__ == "__main__":
    main()
