"""Where a checkpoint's cost goes on a device: the GPT example's step beside a save's transfer.

    python benchmarks/save_probe.py --device --json probe.json   # on an accelerator (GPT-2 small)
    python benchmarks/save_probe.py --smoke                      # tiny sizes on CPU: checks it runs

Two parts, in one process:

- `beside`: the hand-written GPT step of `benchmarks/gpt.py` timed over 12 steps (bf16-mixed,
  2 micro-batches, clipping), alone and with, started after the second step is queued, each of
  what a save does beside the loop: a copy of the state within the device's memory brought to the
  host by another thread in one `device_get` (`copy + get`) or leaf by leaf (`copy + get by
  leaf`), and a thread of pure Python for 0.5 s (`gil`: a writer's Python holding the
  interpreter). The ms per step of each, and the copy's and the transfer's own seconds: what a
  transfer costs the step when the step is queued and the host has nothing else to do.
- `fit`: fitjax's fit of the same model with its defaults on (bar, logger, default checkpoint),
  epochs of 8 optimizer steps, profiled over steps 5 to 20 (two epoch ends): each program's start
  and length on the device, the idle stretches over 1 ms, when the loop made each save's copy and
  how long the writer's thread took to bring it to the host, and the default checkpoint's figures.
  Where the device sits idle at an epoch end, and for how long against the transfer's time.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
import threading
import time

if __name__ == "__main__":  # --help before JAX is imported
    _HELP = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _HELP.add_argument("--device", action="store_true", help="GPT-2 small's shape on the accelerator JAX finds")
    _HELP.add_argument("--smoke", action="store_true", help="tiny sizes on CPU, seconds: checks the script runs")
    _HELP.add_argument("--json", default=None, help="write the figures here as JSON")
    ARGS = _HELP.parse_args()
    if ARGS.device and "--device" not in sys.argv:  # given abbreviated: benchmarks/gpt.py looks for the word
        sys.argv.append("--device")  # to keep JAX's own devices (no 8 virtual CPUs)

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
_SPEC = importlib.util.spec_from_file_location("gpt_bench", os.path.join(_HERE, "gpt.py"))
bench = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(bench)  # benchmarks/gpt.py: its hand-written step and its model, by another name

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import fitjax as fj  # noqa: E402
from fitjax.callbacks._base import ignores_batch  # noqa: E402
from fitjax.checkpoint import _writer  # noqa: E402  (its copies timed where they are made and moved)

import _results  # noqa: E402
from _trace import device_lane, idle_of  # noqa: E402


def beside(shape: dict, data: np.ndarray, steps: int) -> dict[str, list]:
    model = bench.gpt.gpt_model(**bench._model_shape(shape))
    tx = optax.chain(optax.clip_by_global_norm(bench.CLIP), bench.optimizer(1e-3, 100))
    example = jnp.zeros((shape["batch_size"], shape["context"]), jnp.int32)
    held = {"params": jax.jit(lambda k: bench.nn.unbox(model.init(k, example)["params"]))(jax.random.key(0))}
    held["opt"] = jax.jit(tx.init)(held["params"])
    step = jax.jit(bench.hand_written_step(model, tx), donate_argnums=(0, 1))
    rows = bench.ACCUMULATE * shape["batch_size"]
    rng = np.random.default_rng(0)
    micro = [data[rng.permutation(len(data))[:rows]].reshape(bench.ACCUMULATE, shape["batch_size"], -1)
             for _ in range(4)]

    def run(n: int, side=None) -> tuple[float, dict]:
        jax.block_until_ready(held["params"])
        start, thread, info = time.perf_counter(), None, {}
        for i in range(n):
            held["params"], held["opt"], _ = step(held["params"], held["opt"], micro[i % 4])
            if i == 1 and side is not None:
                thread = side(info)
        jax.block_until_ready(held["params"])
        seconds = time.perf_counter() - start
        if thread is not None:
            thread.join()
        return seconds / n * 1e3, info

    def device_copy(info: dict) -> list:
        start = time.perf_counter()
        leaves = jax.tree.leaves((held["params"], held["opt"]))
        copies = jax.device_put(leaves, [x.sharding for x in leaves], may_alias=False)
        info["copy_s"] = time.perf_counter() - start
        return copies

    def on_thread(work, info: dict, key: str) -> threading.Thread:
        def timed():
            start = time.perf_counter()
            work()
            info[key] = time.perf_counter() - start
        thread = threading.Thread(target=timed)
        thread.start()
        return thread

    def whole(info):
        copies = device_copy(info)
        return on_thread(lambda: jax.device_get(copies), info, "get_s")

    def by_leaf(info):
        copies = device_copy(info)
        return on_thread(lambda: [np.asarray(x) for x in copies], info, "get_s")

    def gil(info):
        def busy():
            start = time.perf_counter()
            while time.perf_counter() - start < 0.5:
                pass
        return on_thread(busy, info, "busy_s")

    run(3)  # compiled and warm
    kinds = [("plain", None), ("copy + get", whole), ("copy + get by leaf", by_leaf), ("gil 0.5 s", gil),
             ("plain again", None)]
    return {name: list(run(steps, side)) for name, side in kinds}


class _Steps(fj.Callback):
    """When the loop got past each step; reads no batch, so the loop feeds the steps as it does
    for `benchmarks/gpt.py`'s timer."""

    def __init__(self):
        self.ends = []

    @ignores_batch
    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.ends.append([trainer.global_step, time.perf_counter()])


def fit(shape: dict, data: np.ndarray, *, epoch_steps: int, first: int, traced: int, steps: int) -> dict:
    made, moved = [], []
    init, host = _writer._HostCopy.__init__, _writer._HostCopy.host

    def timed_init(self, tree, on_device):
        start = time.perf_counter()
        init(self, tree, on_device)
        made.append([start, on_device, time.perf_counter() - start])

    def timed_host(self):
        start = time.perf_counter()
        out = host(self)
        moved.append([start, time.perf_counter() - start])
        return out

    _writer._HostCopy.__init__, _writer._HostCopy.host = timed_init, timed_host
    root = tempfile.mkdtemp()
    folder, ends = os.path.join(root, "trace"), _Steps()
    module = bench.gpt.GPTModule(**bench._model_shape(shape), lr=1e-3, warmup=10, total_steps=steps)
    rows = epoch_steps * bench.ACCUMULATE * shape["batch_size"]
    start = time.perf_counter()
    with open(os.devnull, "w") as sink:
        trainer = fj.Trainer(max_steps=steps, precision="bf16-mixed", accumulate_grad_batches=bench.ACCUMULATE,
                             gradient_clip_val=bench.CLIP, default_root_dir=root, enable_model_summary=False,
                             callbacks=[bench.Profile(folder, first, traced), ends,
                                        fj.RichProgressBar(file=sink, force_terminal=True)])
        try:
            trainer.fit(module, fj.DataLoader({"tokens": data[:rows]}, batch_size=shape["batch_size"], shuffle=True,
                                              drop_last=True))
        finally:
            _writer._HostCopy.__init__, _writer._HostCopy.host = init, host
    default = trainer.checkpoint_callback
    out = {"fit_s": time.perf_counter() - start, "epoch_steps": epoch_steps, "traced_steps": [first, first + traced],
           "copies_made": [[t - start, on_device, s] for t, on_device, s in made],  # [at s, on device, took s]
           "copies_moved": [[t - start, s] for t, s in moved],  # [at s, took s] on the writer's thread
           "step_ends": [[n, round(t - start, 4)] for n, t in ends.ends],  # when the loop got past each
           "default_checkpoint": {k: getattr(default, k) for k in ("save_seconds", "write_wait_seconds",
                                                                   "write_cpu_seconds", "transfer_seconds",
                                                                   "skipped_saves")}}
    lane = device_lane(folder)
    if lane:
        out["programs_ms"] = [[round((a - lane[0][0]) / 1e3, 2), round((b - a) / 1e3, 2)] for a, b in lane]
    out["idle"] = idle_of(lane)  # None on CPU: no device lane
    return out


def main(args) -> None:
    shape = bench.SMOKE_SHAPE if args.smoke else bench.SHAPES["gpt2-small"]
    train, _ = bench.gpt.splits(shape["context"])
    data = train["tokens"]
    print(f"jax {jax.__version__} on {jax.devices()[0].device_kind} ({jax.devices()[0].platform})", flush=True)
    side = beside(shape, data, steps=4 if args.smoke else 12)
    print(f"{'beside the step':<22} {'ms/step':>8}  seconds")
    for name, (ms, info) in side.items():
        print(f"{name:<22} {ms:>8.1f}  " + ", ".join(f"{k} {v:.3f}" for k, v in info.items()), flush=True)
    small = dict(epoch_steps=2, first=1, traced=3, steps=6) if args.smoke else \
        dict(epoch_steps=8, first=5, traced=15, steps=30)
    traced = fit(shape, data, **small)
    idle = traced.get("idle")
    print(f"fit, {small['epoch_steps']}-step epochs, steps {small['first']}-{small['first'] + small['traced']} "
          "traced: " + (f"idle {idle['idle_share']:.1%}, stretches over 1 ms [at, ms] {idle['gaps_ms']}" if idle
                        else "no device lane in the trace (a CPU's programs are not listed there)"))
    print("saves' copies made on the loop [at s, on device, took s]:", traced["copies_made"])
    print("moved to the host by the writer [at s, took s]:", traced["copies_moved"])
    print("default checkpoint:", traced["default_checkpoint"], flush=True)
    _results.record(args.json, {"shape": shape, "beside": side, "fit": traced})


if __name__ == "__main__":
    main(ARGS)
