"""The ported programs against their originals' loops: whole-program wall time, in one process.

    python benchmarks/ported.py            # both programs, 3 repeats (a few minutes on 2 cores)
    python benchmarks/ported.py --smoke    # one tiny repeat of each: checks the script runs

Rows (ratio = the original loop's wall time / the port's, median over repeats, the two run
alternately so machine drift hits both; >= 1.0 means the port is as fast; target >= 1.0 with
fitjax's defaults on: progress bar, model summary, TensorBoard, a checkpoint per epoch):

- `mnist`: Flax's NNX MNIST loop as its `train.py` writes it (`nnx.jit` train and eval steps,
  `nnx.Optimizer`, `nnx.MultiMetric`, numpy batches, TensorBoard scalars each epoch) against
  `examples/flax_mnist.py`. Digits tiled `--tile` times stand in for MNIST.
- `sst2`: Flax's SST-2 loop (`jax.jit` train and eval steps over a Linen BiLSTM, dropout keys
  split per step, bucketed widths, TensorBoard scalars each epoch) against
  `examples/flax_sst2.py`, on the same generated sentences and batches.

Whole programs are timed, compilation included: a user's wall clock. Both sides write their
TensorBoard events into a scratch folder; fitjax's other output is discarded.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tile", type=int, default=8, help="MNIST rows: the digits repeated this many times")
    parser.add_argument("--smoke", action="store_true", help="one repeat, one epoch, tiny data: checks it runs")
    parser.add_argument("--only", choices=("mnist", "sst2"), action="append", help="these rows only")
    return parser


if __name__ == "__main__":  # --help (or a wrong argument) answered before JAX is imported
    _parser().parse_args()


os.environ.setdefault("JAX_PLATFORMS", "cpu")  # libtpu in the dev extra: no TPU probe at start-up

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from tensorboardX import SummaryWriter

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import flax_mnist  # noqa: E402
import flax_sst2  # noqa: E402

import fitjax as fj  # noqa: E402


def mnist_data(tile: int):
    train, test = flax_mnist.splits()
    return {k: np.concatenate([v] * tile) for k, v in train.items()}, test


def mnist_original(train, test, epochs: int, batch_size: int, logdir: str) -> None:
    """The original's loop, structure for structure, on numpy batches."""
    model = flax_mnist.CNN(rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.sgd(0.1, 0.9), wrt=nnx.Param)
    metrics = nnx.MultiMetric(accuracy=nnx.metrics.Accuracy(), loss=nnx.metrics.Average("loss"))
    rngs = nnx.Rngs(0)
    writer = SummaryWriter(logdir)

    def loss_fn(model, batch, rngs):
        logits = model(batch["image"], rngs)
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean(), logits

    @nnx.jit
    def train_step(model, optimizer, metrics, batch, rngs):
        (loss, logits), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model, batch, rngs)
        metrics.update(loss=loss, logits=logits, labels=batch["label"])
        optimizer.update(model, grads)

    @nnx.jit
    def eval_step(model, metrics, batch):
        loss, logits = loss_fn(model, batch, None)
        metrics.update(loss=loss, logits=logits, labels=batch["label"])

    n = len(train["label"])
    for epoch in range(1, epochs + 1):
        model.train()
        order = np.random.default_rng(epoch).permutation(n)
        for i in range(n // batch_size):
            rows = order[i * batch_size:(i + 1) * batch_size]
            train_step(model, optimizer, metrics, {k: v[rows] for k, v in train.items()}, rngs)
        train_metrics = metrics.compute()
        metrics.reset()
        model.eval()
        for i in range(len(test["label"]) // batch_size):
            eval_step(model, metrics, {k: v[i * batch_size:(i + 1) * batch_size] for k, v in test.items()})
        eval_metrics = metrics.compute()
        metrics.reset()
        for name, value in (("train_loss", train_metrics["loss"]), ("train_accuracy", train_metrics["accuracy"]),
                            ("test_loss", eval_metrics["loss"]), ("test_accuracy", eval_metrics["accuracy"])):
            writer.add_scalar(name, float(value), epoch)
    writer.close()


def sst2_original(train, val, epochs: int, logdir: str) -> None:
    """Flax's SST-2 loop: params and optimizer state by hand, a dropout key split per step."""
    model = flax_sst2.TextClassifier()
    first = next(iter(val))
    params = model.init(jax.random.key(0), first["tokens"], first["length"], train=False)["params"]
    tx = optax.chain(optax.add_decayed_weights(3e-6), optax.sgd(0.1, 0.9))
    opt_state = tx.init(params)
    writer = SummaryWriter(logdir)

    def loss_fn(params, batch, rng, train):
        logits = model.apply({"params": params}, batch["tokens"], batch["length"], train=train, rngs={"dropout": rng})
        loss = optax.sigmoid_binary_cross_entropy(logits, batch["label"].astype(jnp.float32)).mean()
        return loss, ((logits > 0) == (batch["label"] == 1)).mean()

    @jax.jit
    def train_step(params, opt_state, batch, rng):
        (loss, acc), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch, rng, True)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss, acc

    eval_step = jax.jit(lambda params, batch: loss_fn(params, batch, jax.random.key(0), False))
    rng = jax.random.key(0)
    for epoch in range(1, epochs + 1):
        sums = []
        for batch in train:
            rng, step_rng = jax.random.split(rng)
            params, opt_state, loss, acc = train_step(params, opt_state, batch, step_rng)
            sums.append((loss, acc))
        train_loss = float(np.mean([float(loss) for loss, _ in sums]))
        evals = [(eval_step(params, batch), len(batch["label"])) for batch in val]
        count = sum(n for _, n in evals)
        val_loss = sum(float(loss) * n for (loss, _), n in evals) / count
        writer.add_scalar("train_loss", train_loss, epoch)
        writer.add_scalar("eval_loss", val_loss, epoch)
    writer.close()


def ported(module, train, val, epochs: int, root: str) -> None:
    """The port, fitjax's defaults on; the bar drawn as on a terminal into a discarded stream."""
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        trainer = fj.Trainer(max_epochs=epochs, default_root_dir=root, seed=0,
                             callbacks=[fj.RichProgressBar(file=sink, force_terminal=True)])
        trainer.fit(module, train, val)


def timed(fn, *args) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def main(argv=None):
    args = _parser().parse_args(argv)
    repeats, tile, mnist_epochs, sst2_epochs, sentences, width = args.repeats, args.tile, 10, 6, 4000, 24
    if args.smoke:
        repeats, tile, mnist_epochs, sst2_epochs, sentences, width = 1, 1, 1, 1, 256, 8  # one width
    print(f"jax {jax.__version__} on {jax.devices()[0].platform} ({jax.device_count()} device(s), the port "
          f"uses them all as a user's run would); {repeats} repeats, compilation included", flush=True)
    print(f"{'row':<6} {'original s':>10} {'port s':>8} {'ratio':>7} {'target':>7}", flush=True)
    with tempfile.TemporaryDirectory() as root:
        train, test = mnist_data(tile)
        loader = lambda: fj.DataLoader(train, batch_size=128, shuffle=True, drop_last=True, seed=0)  # noqa: E731
        rows = {
            "mnist": (lambda i: mnist_original(train, test, mnist_epochs, 128, f"{root}/m{i}"),
                      lambda i: ported(flax_mnist.MNISTClassifier(), loader(), fj.DataLoader(test, batch_size=128),
                                       mnist_epochs, f"{root}/p{i}")),
            "sst2": (lambda i: sst2_original(*sst2_batches(sentences, width), sst2_epochs, f"{root}/s{i}"),
                     lambda i: ported(flax_sst2.SST2Classifier(), *sst2_batches(sentences, width), sst2_epochs,
                                      f"{root}/q{i}")),
        }
        for name, (original, port) in rows.items():
            if args.only and name not in args.only:
                continue
            base, runs = [], []
            for i in range(repeats):
                jax.clear_caches()  # each run compiles, as a fresh program does
                base.append(timed(original, i))
                jax.clear_caches()
                runs.append(timed(port, i))
            ratios = [b / r for b, r in zip(base, runs)]
            ratio = statistics.median(ratios)
            print(f"{name:<6} {min(base):>10.1f} {min(runs):>8.1f} {ratio:>6.2f}x {'>= 1.00':>7}  "
                  f"{'ok' if ratio >= 1.0 else 'BELOW'}  (repeats {min(ratios):.2f}-{max(ratios):.2f}x)", flush=True)


def sst2_batches(n: int, max_length: int):
    return (flax_sst2.BucketedBatches(flax_sst2.sentences(n, 0, max_length), shuffle=True, seed=0, drop_last=True),
            flax_sst2.BucketedBatches(flax_sst2.sentences(n // 4, 1, max_length)))


if __name__ == "__main__":
    main()
