"""What F1 + AUROC + a confusion matrix cost a fit: steps per second of the imbalanced-digits fit
with and without them (target: at most 5% slower).

    PYTHONPATH=. python benchmarks/metrics_cost.py [--epochs 6] [--repeats 3] [--train] [--smoke]

Both fits are the same program except for the metrics in `metrics()` (on validation only, as the
example logs them, and on validation and train with `--train`). Each fit is timed from its second
epoch (the first compiles the steps), validations included; the ratio of the best of `--repeats`
is printed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--train", action="store_true", help="the metrics on the train step too")
    parser.add_argument("--smoke", action="store_true", help="one short epoch, once (checks the script runs)")
    return parser


if __name__ == "__main__":  # --help (or a wrong argument) answered before JAX is imported
    _parser().parse_args()


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))

import jax  # noqa: E402
import optax  # noqa: E402

import fitjax as fj  # noqa: E402
from imbalanced_digits import ImbalancedDigits, imbalanced_splits  # noqa: E402


class Plain(ImbalancedDigits):
    def metrics(self, batch, logits):
        return {"acc": (logits.argmax(-1) == batch["label"]).mean()}


class Everywhere(ImbalancedDigits):
    """The metrics on the train step too (their cost in the step that runs most)."""

    def metrics(self, batch, logits):
        training, self.training = self.training, False
        try:
            return super().metrics(batch, logits)
        finally:
            self.training = training


class Clock(fj.Callback):
    """Times the epochs after the first (the first compiles the train and validation steps)."""

    def on_train_epoch_start(self, trainer, module):
        if trainer.current_epoch == 1:
            self.start, self.step = time.perf_counter(), trainer.global_step

    def on_train_end(self, trainer, module):
        self.seconds, self.steps = time.perf_counter() - self.start, trainer.global_step - self.step


def seconds(cls, epochs: int, train, val) -> tuple[float, int]:
    """Seconds and steps of epochs 1.. of a fit (each with its validation)."""
    clock = Clock()
    trainer = fj.Trainer(max_epochs=epochs + 1, logger=False, enable_progress_bar=False, enable_checkpointing=False,
                         enable_model_summary=False, num_sanity_val_steps=0, callbacks=[clock])
    trainer.fit(cls(), fj.DataLoader(train, batch_size=32, shuffle=True, drop_last=True),
                fj.DataLoader(val, batch_size=128))
    return clock.seconds, clock.steps


def main() -> None:
    args = _parser().parse_args()
    if args.smoke:
        args.epochs, args.repeats = 1, 1
    train, val = imbalanced_splits()
    with_metrics = Everywhere if args.train else ImbalancedDigits
    best = {}
    for _ in range(args.repeats):
        for cls in (Plain, with_metrics):
            took, steps = seconds(cls, args.epochs, train, val)
            best[cls] = min(best.get(cls, float("inf")), took)
    plain, metered = steps / best[Plain], steps / best[with_metrics]
    print(f"{jax.default_backend()}: {steps} steps + {args.epochs} validations; steps/s without metrics "
          f"{plain:.1f}, with F1 + AUROC + confusion matrix{' (train too)' if args.train else ''} {metered:.1f}: "
          f"ratio {metered / plain:.3f} (target >= 0.95)")


if __name__ == "__main__":
    main()
