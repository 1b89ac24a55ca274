"""N runs of the digits MLP and CNN in one program (`Trainer(runs=N)`) against N fits one after
another, on the same data, seeds and epochs.

    python benchmarks/many_runs.py                  # both models, 8 runs, 3 epochs (~2-4 min on 2 cores)
    python benchmarks/many_runs.py --model cnn      # one model
    python benchmarks/many_runs.py --smoke          # the MLP, 2 runs, 2 epochs: checks it runs

Rows: the wall time of the whole job (building, compiling, training and validating every run:
what a user waits for), and the time of the epochs after the first (compiled, steady state); the
ratio is sequential / together (target >= 3 for the job on a 2-core CPU). Both sides run without
progress bar, model summary, logger or checkpoints, validating every epoch. The examples' digits
CNN (`examples/digits.py`) and an MLP 64-128-128-10 on the same digits, batches of 64.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import time
from pathlib import Path


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["mlp", "cnn", "both"], default="both")
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="the MLP, 2 runs, 2 epochs: checks it runs")
    return parser


if __name__ == "__main__":  # --help (or a wrong argument) answered before JAX is imported
    _parser().parse_args()


import flax.linen as nn
import jax
import optax

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

import fitjax as fj  # noqa: E402
from digits import DigitsClassifier, digits_splits  # noqa: E402


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool):
        x = x.reshape(x.shape[0], -1)
        x = nn.relu(nn.Dense(128)(x))
        x = nn.relu(nn.Dense(128)(x))
        return nn.Dense(10)(x)


class DigitsMLP(DigitsClassifier):
    """The digits classifier with an MLP in place of the CNN (the same loss, metrics, optimizer)."""

    def __init__(self, lr: float = 3e-3, total_steps: int = 1000):
        fj.LitModule.__init__(self)
        self.save_hyperparameters()
        self.model = MLP()


class EpochClock(fj.Callback):
    """When the first epoch (compilation) ended and when the last one ended."""

    def on_train_epoch_end(self, trainer, module):
        self.last = time.perf_counter()
        if trainer.current_epoch == 0:
            self.first = self.last


def fit(make_module, runs, seed: int, epochs: int, train, val) -> tuple[float, float]:
    """(wall seconds of the whole fit, seconds of its epochs after the first)."""
    clock = EpochClock()
    start = time.perf_counter()
    trainer = fj.Trainer(max_epochs=epochs, runs=runs, seed=seed, callbacks=[clock], logger=False,
                         enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                         log_every_n_steps=10, strategy="single")
    train_loader = fj.DataLoader(train, batch_size=64, shuffle=True, drop_last=True, seed=0)
    with contextlib.redirect_stdout(io.StringIO()):
        trainer.fit(make_module(epochs * len(train_loader)), train_loader, fj.DataLoader(val, batch_size=128))
    return time.perf_counter() - start, clock.last - clock.first


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    if args.smoke:
        args.model, args.runs, args.epochs = "mlp", 2, 2
    train, val = digits_splits()
    models = {"mlp": lambda total: DigitsMLP(total_steps=total),
              "cnn": lambda total: DigitsClassifier(total_steps=total)}
    chosen = list(models) if args.model == "both" else [args.model]
    device = jax.devices()[0]
    print(f"{args.runs} runs of the digits models, {args.epochs} epochs each, one device: {device.device_kind} "
          f"({device.platform}, jax {jax.__version__})")
    print(f"{'model':<6} {'':<14} {'sequential s':>12} {'together s':>10} {'ratio':>6}")
    for name in chosen:
        sequential = [fit(models[name], None, seed, args.epochs, train, val) for seed in range(args.runs)]
        together = fit(models[name], args.runs, 0, args.epochs, train, val)
        seq_job, seq_steady = sum(s[0] for s in sequential), sum(s[1] for s in sequential)
        print(f"{name:<6} {'whole job':<14} {seq_job:>12.1f} {together[0]:>10.1f} {seq_job / together[0]:>6.2f}")
        print(f"{name:<6} {'epochs 2..':<14} {seq_steady:>12.1f} {together[1]:>10.1f} "
              f"{seq_steady / max(together[1], 1e-9):>6.2f}")


if __name__ == "__main__":
    main()
