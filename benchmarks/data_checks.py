"""What checking each host batch costs: fitjax with and without the per-batch data checks.

    python benchmarks/data_checks.py                 # tiny_mlp, 3 repeats
    python benchmarks/data_checks.py --repeats 5 --epochs 4
    python benchmarks/data_checks.py --smoke        # 64-step epochs, 1 repeat: checks it runs

The workload is `benchmarks/overhead.py`'s tiny MLP (batch 32, 64 features, 1024 steps an epoch),
the one where per-step host work shows most. Two feeds:

- `host batches`: a plain list of batches, so every batch is drawn on the host and checked
  (`fitjax.data._checks.check_batch`: shapes and dtypes of its leaves);
- `DataLoader`: `fj.DataLoader`, which on CPU keeps this small workload's data on the device,
  so no batch is drawn on the host after the first and the checks cost nothing per step.

Runs alternate (checked, unchecked, ...) in one process so that drifts in machine load hit both;
"unchecked" swaps the trainer's batch wrapper for a pass-through. The ratio is the median over
repeats of checked steps/s over unchecked steps/s (1.00: no measurable cost; on a shared machine
the run-to-run noise is several percent). The last line times the checks alone: an epoch of host
batches drawn through the trainer's wrapper and drawn bare, per batch, against the hand-written
loop's time per step.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import timeit


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=3, help="including one warm-up epoch")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--smoke", action="store_true",
                        help="64-step epochs, 1 repeat: checks the script runs in seconds (its numbers mean nothing)")
    return parser


if __name__ == "__main__":  # --help (or a wrong argument) answered before JAX is imported
    _parser().parse_args()


sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))
import overhead  # noqa: E402

import fitjax as fj  # noqa: E402
from fitjax.data import _checks  # noqa: E402

trainer_lib = sys.modules[fj.Trainer.__module__]  # where the loop calls checked_batches


def _unchecked(loader, batches=None, **_):
    return iter(loader if batches is None else batches)


def run(data, *, checked: bool, epochs: int, root: str) -> float:
    """Steady-state steps/s of fitjax on `data` (epoch 0, which compiles, is not timed)."""
    trainer_lib.checked_batches = _checks.checked_batches if checked else _unchecked
    timer = overhead.SteadyStateTimer()
    trainer = fj.Trainer(max_epochs=epochs, callbacks=[timer], default_root_dir=root, strategy="single",
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         logger=False)
    trainer.fit(overhead.Classifier(overhead.MLP((64, 64, 10))), data)
    return timer.timing


def main(argv=None):
    args = _parser().parse_args(argv)

    _, shape, batch_size, steps = overhead.WORKLOADS["tiny_mlp"]
    if args.smoke:
        args.repeats, args.epochs, steps = 1, 2, 64
    arrays = overhead.make_data(shape, batch_size * steps)
    host = [{k: v[i * batch_size:(i + 1) * batch_size] for k, v in arrays.items()} for i in range(steps)]
    feeds = {"host batches": host,
             "DataLoader": fj.DataLoader(arrays, batch_size=batch_size, shuffle=True, drop_last=True)}
    print(f"tiny_mlp: batch {batch_size}, {steps} steps/epoch, {args.epochs - 1} timed epochs, "
          f"{args.repeats} repeats")
    print(f"{'feed':<13} {'checked':>12} {'unchecked':>12} {'ratio':>7}")
    with tempfile.TemporaryDirectory() as root:
        for name, data in feeds.items():
            checked, unchecked = [], []
            for _ in range(args.repeats):
                checked.append(run(data, checked=True, epochs=args.epochs, root=root))
                unchecked.append(run(data, checked=False, epochs=args.epochs, root=root))
            ratio = statistics.median(c / u for c, u in zip(checked, unchecked))
            print(f"{name:<13} {max(checked):>10.1f}/s {max(unchecked):>10.1f}/s {ratio:>6.3f}x", flush=True)
        trainer_lib.checked_batches = _checks.checked_batches
    # The checks alone, without the noise of training: one epoch of host batches drawn through
    # the trainer's wrapper, against drawing them bare (the best of 5 passes each).
    def drawn(wrap):
        return min(timeit.repeat(lambda: sum(1 for _ in wrap(host, host)), number=1, repeat=5)) / steps * 1e6

    check_us = drawn(lambda loader, batches: _checks.checked_batches(loader, batches, epoch=0, shards=1))
    bare_us = drawn(_unchecked)
    hand = overhead.hand_written(overhead.MLP((64, 64, 10)), arrays, batch_size, 2)
    print(f"drawing a batch ({len(host[0])} leaves): {check_us:.2f} us checked, {bare_us:.2f} us bare; "
          f"the checks add {check_us - bare_us:.2f} us, {100 * (check_us - bare_us) * hand / 1e6:.2f}% of "
          f"a hand-written step ({1e6 / hand:.0f} us)")


if __name__ == "__main__":
    main()
