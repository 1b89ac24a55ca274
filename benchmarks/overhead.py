"""fitjax against the hand-written Flax/Optax loop, in one process, on the same model and data.

    python benchmarks/overhead.py                  # all three workloads
    python benchmarks/overhead.py --only tiny_mlp --epochs 6
    python benchmarks/overhead.py --steps-per-execution 8   # adds fitjax with k steps per dispatch

The hand-written loop is the one the Flax docs teach: a `flax.training.train_state.TrainState`,
`@jax.jit` on the step, numpy batches sliced from a shuffled array each step. fitjax runs with its
defaults (progress bar, model summary and TensorBoard logger on) except checkpointing, since the
hand-written loop saves nothing; the `+ckpt` column adds fitjax's default per-epoch Orbax
checkpoints, to show what they cost when epochs are this short. Both are timed in steady state
(after a warm-up epoch that includes compilation). Runs alternate (hand-written, fitjax, fitjax
+ckpt, ...) `--repeats` times, so drifts in machine load hit both; each ratio is the median of the
per-repeat ratios (fitjax / the hand-written run just before it), which is steadier on a shared
machine than a ratio of two maxima. The steps/s columns are the best runs. The target is a ratio
of at least 1.0 on every workload.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import flax.linen as nn
import jax
import numpy as np
import optax
from flax.training import train_state

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
    "tiny_mlp": (lambda: MLP((64, 64, 10)), (64,), 32, 2000),
    "mnist_mlp": (lambda: MLP((256, 256, 10)), (784,), 128, 300),
    "small_cnn": (lambda: CNN(), (28, 28, 1), 128, 30),
}


def make_data(shape, n, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, *shape)).astype(np.float32)
    y = rng.integers(0, 10, size=(n,)).astype(np.int32)
    return {"x": x, "y": y}


def cross_entropy(logits, labels):
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


# ----------------------------------------------------------------------------- hand-written loop


def hand_written(model, data, batch_size, epochs):
    """Returns steady-state steps/s of the Flax-docs loop (epoch 0 is the warm-up)."""
    n = len(data["y"])
    params = model.init(jax.random.key(0), data["x"][:batch_size])["params"]
    state = train_state.TrainState.create(apply_fn=model.apply, params=params, tx=optax.adam(1e-3))

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
            start = time.perf_counter()
        perm = np.random.default_rng(epoch).permutation(n)
        for i in range(steps):
            idx = perm[i * batch_size:(i + 1) * batch_size]
            batch = {"x": data["x"][idx], "y": data["y"][idx]}
            state, loss = train_step(state, batch)
    jax.block_until_ready(state)
    return steps * (epochs - 1) / (time.perf_counter() - start)


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
    """Times epochs 1.. (epoch 0 compiles). Epoch hooks only: adds no per-step work."""

    def on_train_epoch_start(self, trainer, module):
        if trainer.current_epoch == 1:
            jax.block_until_ready(trainer.state)
            self.start, self.start_step = time.perf_counter(), trainer.global_step

    def on_train_end(self, trainer, module):
        jax.block_until_ready(trainer.state)
        self.steps_per_s = (trainer.global_step - self.start_step) / (time.perf_counter() - self.start)


def with_fitjax(model, data, batch_size, epochs, root, *, module_cls=Classifier, **trainer_kwargs):
    timer = SteadyStateTimer()
    trainer = fj.Trainer(max_epochs=epochs, callbacks=[timer], default_root_dir=root, strategy="single",
                         **trainer_kwargs)
    trainer.fit(module_cls(model), fj.DataLoader(data, batch_size=batch_size, shuffle=True, drop_last=True))
    return timer.steps_per_s


def median_ratio(runs: list[float], hand: list[float]) -> float:
    """The median over repeats of `runs[i] / hand[i]` (each fitjax run against the hand-written
    run of the same repeat)."""
    return statistics.median(r / h for r, h in zip(runs, hand))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=sorted(WORKLOADS), action="append")
    parser.add_argument("--epochs", type=int, default=4, help="including one warm-up epoch")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps-per-execution", type=int, default=1,
                        help="also time fitjax with Trainer(steps_per_execution=K) when K > 1")
    args = parser.parse_args(argv)
    spe = args.steps_per_execution

    print(f"jax {jax.__version__} on {jax.devices()[0].platform} ({jax.device_count()} device(s))")
    extra = f" {'spe=' + str(spe):>10} {'ratio':>7}" if spe > 1 else ""
    print(f"{'workload':<11} {'hand-written':>13} {'fitjax':>10} {'ratio':>7} {'+ckpt':>10} {'ratio':>7}{extra}")
    with tempfile.TemporaryDirectory() as root:
        for name in args.only or list(WORKLOADS):
            factory, shape, batch_size, steps = WORKLOADS[name]
            data = make_data(shape, batch_size * steps)
            hand, fit, fit_ckpt, fit_spe = [], [], [], []
            for _ in range(args.repeats):  # alternate, so drifts in machine load hit both
                hand.append(hand_written(factory(), data, batch_size, args.epochs))
                fit.append(with_fitjax(factory(), data, batch_size, args.epochs, root,
                                       enable_checkpointing=False))
                fit_ckpt.append(with_fitjax(factory(), data, batch_size, args.epochs, root))
                if spe > 1:
                    fit_spe.append(with_fitjax(factory(), data, batch_size, args.epochs, root,
                                               enable_checkpointing=False, steps_per_execution=spe))
            columns = [hand, fit, fit_ckpt] + ([fit_spe] if spe > 1 else [])
            cells = [f"{max(hand):>10.1f}/s"] + [
                f"{max(runs):>8.1f}/s {median_ratio(runs, hand):>6.2f}x" for runs in columns[1:]]
            print(f"{name:<11} " + " ".join(cells), flush=True)


if __name__ == "__main__":
    main()
