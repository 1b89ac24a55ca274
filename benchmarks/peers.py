"""fitjax against its peers in one process: Keras 3's `fit` (JAX backend) and Lightning 2.6 (torch).

    python benchmarks/peers.py                   # every row (several minutes on 2 cores)
    python benchmarks/peers.py --only keras      # one peer
    python benchmarks/peers.py --gpu             # the accelerator JAX and torch see (torch on CUDA)
    python benchmarks/peers.py --smoke           # the tiny MLP, short epochs: checks it runs in seconds

The peers come with `pip install -e ".[bench]"` (keras, lightning; torch is the dev extra's);
a peer that is not installed is skipped with a line saying so.

The same three workloads as `benchmarks/overhead.py` (tiny MLP 64-64-10 with batches of 32 and
1024-step epochs, an MNIST-sized MLP 784-256-256-10 with batches of 128, a small CNN), the same
data, Adam(1e-3) and softmax cross-entropy on every side, shuffled batches, the last short batch
dropped. Each side is timed in steady state (epoch 0, which compiles, is a warm-up) in steps/s.
Configurations:

- `defaults`: each framework with its own defaults. fitjax: progress bar, model summary,
  TensorBoard, the default checkpoint. Keras: `fit(verbose=1)`'s progress bar, nothing saved.
  Lightning: its progress bar, model summary, its default logger and a checkpoint per epoch,
  `accelerator="cpu"` (or "gpu" with `--gpu`), `num_workers=0` loaders of torch tensors.
- `spe=32`: fitjax's and Keras's `steps_per_execution=32` (Lightning has no such option), with the
  defaults otherwise.

Every progress bar draws into a stream nobody reads (as on a terminal for fitjax). Each ratio is
fitjax's steps/s over the peer's, the median of per-repeat ratios; the runs of a repeat
alternate their order so that a change in the machine's load hits every side. The load average
before and after is printed: on a shared machine read the ratios, not the steps/s.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import os
import statistics
import sys
import tempfile
import time

from _workload_names import WORKLOAD_NAMES  # overhead.py's, without importing JAX


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=("keras", "lightning"), action="append", help="these peers only")
    parser.add_argument("--workload", choices=WORKLOAD_NAMES, action="append",
                        help="these workloads only (repeatable)")
    parser.add_argument("--epochs", type=int, default=3, help="including one warm-up epoch")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--gpu", action="store_true", help="Lightning on CUDA (JAX uses its default device)")
    parser.add_argument("--smoke", action="store_true",
                        help="the tiny MLP only, 64-step epochs, 1 repeat: checks it runs (numbers mean nothing)")
    return parser


if __name__ == "__main__":  # --help (or a wrong argument) answered before JAX is imported
    _parser().parse_args()

os.environ.setdefault("KERAS_BACKEND", "jax")  # before keras is imported (it is, lazily, below)

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
import overhead  # noqa: E402  (the workloads, the data and the fitjax side)

SPE = 32


def _installed(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


# ------------------------------------------------------------------------------------- Keras


def keras_model(workload: str, shape: tuple[int, ...]):
    import keras

    layers = keras.layers
    if workload == "small_cnn":
        body = [layers.Conv2D(32, 3, padding="same", activation="relu"), layers.MaxPooling2D(2),
                layers.Conv2D(64, 3, padding="same", activation="relu"), layers.MaxPooling2D(2),
                layers.Flatten(), layers.Dense(256, activation="relu"), layers.Dense(10)]
    else:
        widths = (64, 64) if workload == "tiny_mlp" else (256, 256)
        body = [layers.Flatten(), *[layers.Dense(w, activation="relu") for w in widths], layers.Dense(10)]
    return keras.Sequential([keras.Input(shape), *body])


def with_keras(workload: str, shape, data, batch_size: int, epochs: int, *, spe: int = 1) -> float:
    import keras

    class Timer(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 1:
                self.start = time.perf_counter()

        def on_train_end(self, logs=None):
            self.seconds = time.perf_counter() - self.start

    model = keras_model(workload, shape)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), steps_per_execution=spe,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    steps = len(data["y"]) // batch_size
    timer = Timer()
    with contextlib.redirect_stdout(io.StringIO()):
        # whole batches only, as the other sides drop the short last one
        model.fit(data["x"][:steps * batch_size], data["y"][:steps * batch_size], batch_size=batch_size,
                  epochs=epochs, shuffle=True, verbose=1, callbacks=[timer])
    return steps * (epochs - 1) / timer.seconds


# --------------------------------------------------------------------------------- Lightning


def torch_model(workload: str, shape: tuple[int, ...]):
    from torch import nn

    if workload == "small_cnn":
        return nn.Sequential(nn.Conv2d(shape[-1], 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                             nn.Linear(64 * (shape[0] // 4) * (shape[1] // 4), 256), nn.ReLU(), nn.Linear(256, 10))
    widths = (64, 64) if workload == "tiny_mlp" else (256, 256)
    layers, width = [nn.Flatten()], int(np.prod(shape))
    for w in widths:
        layers += [nn.Linear(width, w), nn.ReLU()]
        width = w
    return nn.Sequential(*layers, nn.Linear(width, 10))


def with_lightning(workload: str, shape, data, batch_size: int, epochs: int, root: str, *, gpu: bool) -> float:
    import lightning as L
    import torch

    class Classifier(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = torch_model(workload, shape)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.cross_entropy(self.model(x), y)
            self.log("train/loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    class Timer(L.Callback):
        def on_train_epoch_start(self, trainer, module):
            if trainer.current_epoch == 1:
                self._sync(module)
                self.start, self.start_step = time.perf_counter(), trainer.global_step

        def on_train_end(self, trainer, module):
            self._sync(module)
            self.steps_per_s = (trainer.global_step - self.start_step) / (time.perf_counter() - self.start)

        @staticmethod
        def _sync(module):
            if module.device.type == "cuda":
                torch.cuda.synchronize()

    x = torch.from_numpy(data["x"])
    if x.ndim == 4:  # NHWC, as the JAX sides take it -> NCHW
        x = x.permute(0, 3, 1, 2).contiguous()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, torch.from_numpy(data["y"]).long()),
                                         batch_size=batch_size, shuffle=True, drop_last=True)
    timer = Timer()
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink), _quiet_lightning():
        trainer = L.Trainer(max_epochs=epochs, accelerator="gpu" if gpu else "cpu", devices=1,
                            default_root_dir=root, callbacks=[timer])
        trainer.fit(Classifier(), loader)
    return timer.steps_per_s


@contextlib.contextmanager
def _quiet_lightning():
    """Lightning's hints (num_workers, the sanity check) say nothing about speed here."""
    import logging
    import warnings

    logger = logging.getLogger("lightning.pytorch")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


# ---------------------------------------------------------------------------------------- main


def _ratio_row(config: str, workload: str, fit: list[float], peer: list[float], peer_name: str) -> str:
    ratio = statistics.median(f / p for f, p in zip(fit, peer))
    return f"{config:<9} {workload:<10} {max(fit):>10.0f} {max(peer):>10.0f}  {peer_name:<10} {ratio:>6.2f}x"


def main(argv=None) -> None:
    args = _parser().parse_args(argv)
    peers = [p for p in (args.only or ["keras", "lightning"])]
    for name in list(peers):
        if not _installed(name):
            print(f"{name}: not installed, skipped (pip install -e \".[bench]\")", flush=True)
            peers.remove(name)
    workloads = {name: overhead.WORKLOADS[name] for name in (args.workload or overhead.WORKLOADS)}
    if args.smoke:
        args.repeats, args.epochs = 1, 2
        factory, shape, batch, _ = overhead.WORKLOADS["tiny_mlp"]
        workloads = {"tiny_mlp": (factory, shape, batch, 64)}

    import jax

    versions = [f"jax {jax.__version__} on {jax.devices()[0].platform}"]
    if "keras" in peers:
        import keras

        versions.append(f"keras {keras.__version__} ({keras.backend.backend()})")
    if "lightning" in peers:
        import lightning
        import torch

        versions.append(f"lightning {lightning.__version__}, torch {torch.__version__} "
                        f"({'cuda' if args.gpu else 'cpu'}, {torch.get_num_threads()} threads)")
    print("; ".join(versions) + f"; {args.repeats} repeats, {args.epochs - 1} timed epochs after a warm-up one; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
    print(f"{'config':<9} {'workload':<10} {'fitjax/s':>10} {'peer/s':>10}  {'peer':<10} {'fitjax/peer':>6}",
          flush=True)
    with tempfile.TemporaryDirectory() as root:
        for workload, (factory, shape, batch_size, steps) in workloads.items():
            data = overhead.make_data(shape, batch_size * steps)
            runs: dict[str, list[float]] = {}

            def run(name, fn):
                runs.setdefault(name, []).append(fn())

            sides = [("fitjax", lambda: overhead.with_fitjax(factory(), data, batch_size, args.epochs, root))]
            if "keras" in peers:
                sides += [("fitjax spe", lambda: overhead.with_fitjax(factory(), data, batch_size, args.epochs,
                                                                      root, steps_per_execution=SPE)),
                          ("keras", lambda: with_keras(workload, shape, data, batch_size, args.epochs)),
                          ("keras spe", lambda: with_keras(workload, shape, data, batch_size, args.epochs,
                                                           spe=SPE))]
            if "lightning" in peers:
                sides.append(("lightning", lambda: with_lightning(workload, shape, data, batch_size, args.epochs,
                                                                  root, gpu=args.gpu)))
            for repeat in range(args.repeats):
                for name, fn in (sides if repeat % 2 == 0 else sides[::-1]):
                    run(name, fn)
            if "keras" in peers:
                print(_ratio_row("defaults", workload, runs["fitjax"], runs["keras"], "keras"), flush=True)
                print(_ratio_row("spe=32", workload, runs["fitjax spe"], runs["keras spe"], "keras"), flush=True)
            if "lightning" in peers:
                print(_ratio_row("defaults", workload, runs["fitjax"], runs["lightning"], "lightning"), flush=True)
    print(f"load average after: {os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()
