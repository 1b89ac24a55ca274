"""LoRA against a full fine-tune of the GPT example: optimizer-state bytes, FLOPs and step time.

    python benchmarks/lora.py            # width 256, 4 layers, rank 8, 25 timed steps each, on one device
    python benchmarks/lora.py --smoke    # seconds: checks it runs (numbers mean nothing)

The runs are `fj.Trainer.fit` of examples/gpt.py's `GPTModule` (AdamW, float32, batch 16 of 128
bytes) from the same weights; the LoRA runs add `apply_lora(rank=8)` on each block's q, v, up and
down. "LoRA, whole tree" is the step as it was before `fitjax.step.trainable`: the loss
differentiated with respect to every parameter, the base's gradients dropped by the optimizer
(`trainable.of` patched to find no mask); "LoRA" differentiates the adapters alone.
Optimizer state: the bytes of `trainer.state.opt_state` after the fit. Checkpoint: the bytes on
disk of `trainer.save_checkpoint` after the fit (the whole state), and for LoRA of
`ModelCheckpoint(weights="trainable")`'s save at the same step (adapters, their optimizer state,
the loop position). FLOPs: XLA's count for
one step (`trainer.train_step_flops()`; exact, unlike times on a shared machine). Step time: the
median wall time between consecutive `on_train_batch_end` calls after the first 5 (compilation
left out), the device synced at each (`jax.block_until_ready` on the state).
The issue's bar: LoRA's optimizer state at most 5% of the full fine-tune's, its step no slower.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="a tiny model and a few steps: checks it runs")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--accumulate", type=int, default=1, help="accumulate_grad_batches")
    parser.add_argument("--clip", type=float, default=None, help="gradient_clip_val")
    return parser


if __name__ == "__main__":  # --help (or a wrong argument) answered before JAX is imported
    _parser().parse_args()


import flax.linen as nn
import jax
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
import fitjax as fj  # noqa: E402
from fitjax.step import trainable  # noqa: E402
import gpt  # noqa: E402

TARGETS = r".*block_\d+/(q|v|up|down)"


class StepTimes(fj.Callback):
    def __init__(self):
        self.times: list[float] = []
        self.flops: float | None = None

    def on_fit_start(self, trainer, module) -> None:
        self.flops = trainer.train_step_flops()

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        jax.block_until_ready(trainer.state.params)
        self.times.append(time.perf_counter())


def run(shape: dict, steps: int, rank: int | None, base, *, mask: bool = True, **trainer_args
        ) -> tuple[int, float, float, int, int | None]:
    module = gpt.GPTModule(**shape, lr=1e-3, warmup=1, total_steps=steps)
    module.load_weights(base)
    if rank is not None:
        module.apply_lora(TARGETS, rank=rank)
    times = StepTimes()
    folder = tempfile.mkdtemp(prefix="fitjax-lora-bench-")
    # saved once, at the end: the trained parameters alone (LoRA: the adapters) with their state
    adapters_only = fj.ModelCheckpoint(folder, filename="trainable", weights="trainable",
                                       every_n_train_steps=steps)
    trainer = fj.Trainer(max_steps=steps, strategy="single", enable_progress_bar=False, logger=False,
                         enable_model_summary=False, callbacks=[times] + [adapters_only] * (rank is not None and mask),
                         enable_checkpointing=rank is not None and mask, **trainer_args)
    train, _ = gpt.splits(shape["context"])
    found = trainable.of
    trainable.of = found if mask else (lambda tx: None)  # no mask: the whole tree differentiated
    try:
        trainer.fit(module, fj.DataLoader({"tokens": train["tokens"][: 16 * steps * trainer_args.get("accumulate_grad_batches", 1)]}, batch_size=16))
    finally:
        trainable.of = found
    state_bytes = sum(np.asarray(x).nbytes for x in jax.tree.leaves(jax.device_get(trainer.state.opt_state)))
    gaps = np.diff(times.times[5:]) if len(times.times) > 6 else np.diff(times.times)
    trainer.save_checkpoint(os.path.join(folder, "whole"))  # the whole state, base included
    whole = folder_bytes(os.path.join(folder, "whole"))
    trained = folder_bytes(adapters_only.last_model_path) if rank is not None and mask else None
    shutil.rmtree(folder)
    return state_bytes, times.flops or float("nan"), float(statistics.median(gaps)), whole, trained


def folder_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def main(argv=None) -> dict[str, float]:
    args = _parser().parse_args(argv)
    shape = dict(layers=1, width=64, heads=2, context=32) if args.smoke else dict(layers=4, width=256, heads=4,
                                                                                     context=128)
    steps = 8 if args.smoke else args.steps
    model = gpt.gpt_model(layers=shape["layers"], width=shape["width"], heads=shape["heads"], context=shape["context"])
    tokens = np.zeros((1, shape["context"]), np.int32)
    weights = nn.meta.unbox(model.init(jax.random.key(0), tokens)["params"])  # both runs start from these
    options = dict(accumulate_grad_batches=args.accumulate, gradient_clip_val=args.clip)
    runs = {"full fine-tune": run(shape, steps, None, weights, **options),
            "LoRA, whole tree": run(shape, steps, args.rank, weights, mask=False, **options),
            f"LoRA rank {args.rank}": run(shape, steps, args.rank, weights, **options)}
    ((full_bytes, full_flops, full_step, full_ckpt, _), (_, old_flops, old_step, _, _),
     (lora_bytes, lora_flops, lora_step, lora_ckpt, adapters_ckpt)) = runs.values()
    result = {"state_fraction": lora_bytes / full_bytes, "flops_ratio": lora_flops / full_flops,
              "step_ratio": lora_step / full_step, "flops_vs_whole_tree": lora_flops / old_flops,
              "step_vs_whole_tree": lora_step / old_step, "checkpoint_fraction": adapters_ckpt / lora_ckpt,
              "checkpoint_vs_full_finetune": adapters_ckpt / full_ckpt}
    print(f"{'':24}" + "".join(f"{name:>18}" for name in runs))
    for row, index, unit in (("optimizer state (KiB)", 0, 1024), ("GFLOPs per step", 1, 1e9),
                             ("step (ms, median)", 2, 1e-3), ("checkpoint (KiB)", 3, 1024)):
        print(f"{row:24}" + "".join(f"{values[index] / unit:18.2f}" for values in runs.values()))
    print(f"LoRA checkpoint of the adapters alone (ModelCheckpoint(weights='trainable')): {adapters_ckpt / 1024:.2f} "
          f"KiB, {result['checkpoint_fraction']:.3f} of the LoRA fit's whole state, "
          f"{result['checkpoint_vs_full_finetune']:.3f} of the full fine-tune's")
    print(f"LoRA / full: state {result['state_fraction']:.3f}, FLOPs {result['flops_ratio']:.3f}, "
          f"step {result['step_ratio']:.3f}")
    print(f"LoRA / LoRA whole tree: FLOPs {result['flops_vs_whole_tree']:.3f}, "
          f"step {result['step_vs_whole_tree']:.3f}")
    return result


if __name__ == "__main__":
    main()
