"""The wall time a checkpoint save adds to the training loop, in one process.

    python benchmarks/checkpoint.py              # tiny MLP, 8192 steps, a save every 1024 steps
    python benchmarks/checkpoint.py --every 512 --repeats 9
    python benchmarks/checkpoint.py --smoke      # seconds: CI runs this so the script cannot rot

The same `fj.Trainer` fit (tiny MLP 64-64-10, batch 32, adam: a ~60 KB train state; progress bar,
summary and logger off) runs without checkpointing and with `ModelCheckpoint(every_n_train_steps=
--every)`, alternating, `--repeats` times. Each repeat gives (time with saves - time without) /
saves: what one save costs the loop, end to end (the host copy, the thread start, the writer
thread's CPU competing with the loop, and the last save's write, which fit waits for); this
difference of two ~1.5 s runs is noisy on a shared machine, so the time the saving hook call
itself blocks the loop's thread is printed too (median over every save), and the process's CPU
time a save adds (all threads: the writer's work, which competes with the loop on a busy machine). The median over
repeats is printed, with Orbax's own checkpointers for reference: the time each blocks its
caller per save (synchronous `Checkpointer`, `AsyncCheckpointer`), measured on the
same state. The budget is 15 ms a save for a state under 1 MB. Last, one save of the same state
with nothing else running, in the layout fitjax writes, in simpler Orbax layouts and as a plain
numpy file: what the format itself costs. With moto and s3fs installed (the dev extra), the same
fit saves to an S3 bucket on a moto server this script starts on 127.0.0.1: the store row (a save
to a store must not block the hook longer than a local one; the upload runs on the writer thread).
"""

from __future__ import annotations

import argparse
import math
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8192, help="train steps per fit (one epoch)")
    parser.add_argument("--every", type=int, default=1024,
                        help="save every this many steps (far enough apart that a save is written "
                             "before the next starts, as per-epoch saves are)")
    parser.add_argument("--repeats", type=int, default=5, help="alternating pairs of fits")
    parser.add_argument("--smoke", action="store_true", help="seconds: 64 steps, 1 repeat, no warm-up")
    return parser


if __name__ == "__main__":  # --help (or a wrong argument) answered before JAX is imported
    _parser().parse_args()


import flax.linen as nn
import jax
import numpy as np
import optax

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import fitjax as fj  # noqa: E402


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(10)(nn.relu(nn.Dense(64)(x)))


class Tiny(fj.LitModule):
    def __init__(self):
        super().__init__()
        self.model = MLP()

    def loss(self, model, batch):
        logits = model(batch["x"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()

    def configure_optimizer(self):
        return optax.adam(1e-3)


def _data(steps: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"x": rng.normal(size=(32 * steps, 64)).astype(np.float32),
            "y": rng.integers(0, 10, size=(32 * steps,)).astype(np.int32)}


class _FirstStep(fj.Callback):
    """Notes when the first step is done: the time before it is compilation, not the loop."""

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if batch_idx == 0:
            self.time, self.cpu = time.perf_counter(), time.process_time()


class _TimedCheckpoint(fj.ModelCheckpoint):
    """Times the hook calls that saved: what a save blocks the loop's thread for."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.blocked: list[float] = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        before, start = self.last_model_path, time.perf_counter()
        super().on_train_batch_end(trainer, module, outputs, batch, batch_idx)
        if self.last_model_path != before:
            self.blocked.append(time.perf_counter() - start)


def _fit(data, folder: str | None, every: int) -> tuple[float, float, fj.Trainer]:
    first = _FirstStep()
    callbacks = [first]
    if folder:
        callbacks.append(_TimedCheckpoint(folder, every_n_train_steps=every, every_n_epochs=0))
    trainer = fj.Trainer(max_epochs=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=folder is not None, callbacks=callbacks)
    module = Tiny()
    loader = fj.DataLoader(data, batch_size=32)
    trainer.fit(module, loader)  # fit returns once the last save is written
    return time.perf_counter() - first.time, time.process_time() - first.cpu, trainer


def _s3_bucket() -> tuple[subprocess.Popen | None, str | None]:
    """A bucket on a moto S3 server started here (`s3://fitjax-bench`), or (None, None) without
    moto or s3fs."""
    try:
        import boto3
        import moto.server  # noqa: F401
        import s3fs  # noqa: F401
    except ImportError:
        return None, None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(300):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.1)
    url = f"http://127.0.0.1:{port}"
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_ENDPOINT_URL=url,
                      AWS_DEFAULT_REGION="us-east-1")
    boto3.client("s3", endpoint_url=url).create_bucket(Bucket="fitjax-bench")
    return proc, "s3://fitjax-bench"


def _orbax_blocking(state, repeats: int) -> dict[str, float]:
    """Median ms each Orbax checkpointer blocks its caller per save of `state`."""
    import orbax.checkpoint as ocp
    from etils import epath

    from fitjax import checkpoint

    out = {}
    with tempfile.TemporaryDirectory() as folder:
        args = lambda: checkpoint.save_args(state, {"global_step": 0})
        sync = ocp.Checkpointer(ocp.CompositeCheckpointHandler())
        asyn = ocp.AsyncCheckpointer(ocp.CompositeCheckpointHandler())
        for name, saver in (("orbax Checkpointer (synchronous)", sync), ("orbax AsyncCheckpointer", asyn)):
            times = []
            for i in range(repeats + 1):
                start = time.perf_counter()
                saver.save(epath.Path(folder) / f"{type(saver).__name__}{i}", args=args())
                times.append(time.perf_counter() - start)
                if hasattr(saver, "wait_until_finished"):
                    saver.wait_until_finished()
            out[name] = 1e3 * statistics.median(times[1:])
        asyn.close()
    return out


def _formats(state, repeats: int) -> dict[str, tuple[float, float]]:
    """Best-of-`repeats` (wall ms, CPU ms of every thread) per save of `state`'s host copy, with
    nothing else running: what fitjax writes, simpler Orbax layouts, and a plain numpy file."""
    import orbax.checkpoint as ocp

    from fitjax import checkpoint

    host = checkpoint.save_args(state, {}, to_host=True)[checkpoint.STATE_ITEM].item  # the saved tree
    plain = {str(i): x for i, x in enumerate(jax.tree.leaves(host))}

    def npz(path):
        os.makedirs(f"{path}.tmp")
        np.savez(f"{path}.tmp/state.npz", **plain)
        os.rename(f"{path}.tmp", path)

    formats = {
        "orbax Composite(state, meta), as fitjax": lambda path: ocp.Checkpointer(ocp.CompositeCheckpointHandler())
            .save(path, args=checkpoint.save_args(state, {"global_step": 0}, to_host=True)),
        "orbax StandardSave alone": lambda path: ocp.Checkpointer(ocp.StandardCheckpointHandler())
            .save(path, args=ocp.args.StandardSave(host)),
        "orbax PyTreeSave without OCDBT": lambda path: ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_ocdbt=False))
            .save(path, args=ocp.args.PyTreeSave(host)),
        "np.savez and a rename (not Orbax)": npz,
    }
    out = {}
    with tempfile.TemporaryDirectory() as folder:
        for i, (name, save) in enumerate(formats.items()):
            save(os.path.join(folder, f"{i}-warm"))
            best = (math.inf, math.inf)
            for r in range(repeats):
                wall, cpu = time.perf_counter(), time.process_time()
                save(os.path.join(folder, f"{i}-{r}"))
                best = min(best, (time.perf_counter() - wall, time.process_time() - cpu))
            out[name] = (1e3 * best[0], 1e3 * best[1])
    return out


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    if args.smoke:
        args.steps, args.every, args.repeats = 64, 32, 1
    data = _data(args.steps)
    saves = (args.steps - 1) // args.every  # after the first step, which is not timed
    cache = tempfile.TemporaryDirectory()  # each Trainer compiles the same two programs: once
    jax.config.update("jax_compilation_cache_dir", cache.name)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)

    server, bucket = _s3_bucket()
    with tempfile.TemporaryDirectory() as root:
        if not args.smoke:  # compile and warm both (the smoke run only checks the script runs)
            _fit(data, None, args.every)
            _fit(data, os.path.join(root, "warm"), args.every)
        costs, cpu_costs, plain_times, blocked = [], [], [], []
        store_costs, store_blocked = [], []
        for r in range(args.repeats):
            plain, plain_cpu, _ = _fit(data, None, args.every)
            saved, saved_cpu, trainer = _fit(data, os.path.join(root, f"r{r}"), args.every)
            plain_times.append(plain)
            costs.append(1e3 * (saved - plain) / saves)
            cpu_costs.append(1e3 * (saved_cpu - plain_cpu) / saves)
            blocked += trainer.checkpoint_callback.blocked
            if bucket:
                stored, _, on_store = _fit(data, f"{bucket}/r{r}", args.every)
                store_costs.append(1e3 * (stored - plain) / saves)
                store_blocked += on_store.checkpoint_callback.blocked
        if server is not None:
            server.kill()
        state = trainer.state
        size = sum(x.nbytes for x in jax.tree.leaves(state))
        orbax = _orbax_blocking(state, 1 if args.smoke else 8)
        formats = _formats(state, 1 if args.smoke else 10)

    print(f"train state: {size / 1024:.0f} KB; {args.steps} steps, a save every {args.every} "
          f"({saves} saves); median of {args.repeats} repeats")
    print(f"{'what':40s} {'ms per save':>12s}")
    print(f"{'fitjax ModelCheckpoint, added to the loop':40s} {statistics.median(costs):12.1f}")
    print(f"{'fitjax ModelCheckpoint, blocking its hook':40s} {1e3 * statistics.median(blocked):12.1f}")
    print(f"{'fitjax ModelCheckpoint, CPU (all threads)':40s} {statistics.median(cpu_costs):12.1f}")
    if bucket:
        print(f"{'to s3:// (moto, 127.0.0.1), added to loop':40s} {statistics.median(store_costs):12.1f}")
        print(f"{'to s3:// (moto, 127.0.0.1), blocking hook':40s} {1e3 * statistics.median(store_blocked):12.1f}")
    else:
        print("(no store row: pip install s3fs 'moto[server]' to measure saves to s3://)")
    for name, ms in orbax.items():
        print(f"{name + ', blocking':40s} {ms:12.1f}")
    print(f"(per-repeat fitjax costs: {', '.join(f'{c:.1f}' for c in costs)} ms; a fit without "
          f"saves takes {1e3 * statistics.median(plain_times):.0f} ms)")
    print(f"\none save of the same state, nothing else running (best of 10):\n{'format':40s} {'wall ms':>8s} {'CPU ms':>8s}")
    for name, (wall, cpu) in formats.items():
        print(f"{name:40s} {wall:8.1f} {cpu:8.1f}")


if __name__ == "__main__":
    main()
