"""LoRA against a full fine-tune of the GPT example: optimizer-state bytes and step time.

    python benchmarks/lora.py            # width 256, 4 layers, rank 8, 40 timed steps each, on one device
    python benchmarks/lora.py --smoke    # seconds: checks it runs (numbers mean nothing)

Both runs are `fj.Trainer.fit` of examples/gpt.py's `GPTModule` (AdamW, float32, batch 16 of 128
bytes) from the same weights; the LoRA run adds `apply_lora(rank=8)` on each block's q, v, up and
down. Optimizer state: the bytes of `trainer.state.opt_state` after the fit. Step time: the median
wall time between consecutive `on_train_batch_end` calls after the first 5 (compilation left out),
the device synced at each (`jax.block_until_ready` on the state), so it is each step's own time.
The issue's bar: LoRA's optimizer state at most 5% of the full fine-tune's, its step no slower.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import flax.linen as nn
import jax
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
import fitjax as fj  # noqa: E402
import gpt  # noqa: E402

TARGETS = r".*block_\d+/(q|v|up|down)"


class StepTimes(fj.Callback):
    def __init__(self):
        self.times: list[float] = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        jax.block_until_ready(trainer.state.params)
        self.times.append(time.perf_counter())


def run(shape: dict, steps: int, rank: int | None, base) -> tuple[int, float]:
    module = gpt.GPTModule(**shape, lr=1e-3, warmup=1, total_steps=steps)
    module.load_weights(base)
    if rank is not None:
        module.apply_lora(TARGETS, rank=rank)
    times = StepTimes()
    trainer = fj.Trainer(max_steps=steps, strategy="single", enable_progress_bar=False, logger=False,
                         enable_checkpointing=False, enable_model_summary=False, callbacks=[times])
    train, _ = gpt.splits(shape["context"])
    trainer.fit(module, fj.DataLoader({"tokens": train["tokens"][: 16 * steps]}, batch_size=16))
    state_bytes = sum(np.asarray(x).nbytes for x in jax.tree.leaves(jax.device_get(trainer.state.opt_state)))
    gaps = np.diff(times.times[5:]) if len(times.times) > 6 else np.diff(times.times)
    return state_bytes, float(statistics.median(gaps))


def main(argv=None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="a tiny model and a few steps: checks it runs")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--steps", type=int, default=45)
    args = parser.parse_args(argv)
    shape = dict(layers=1, width=64, heads=2, context=32) if args.smoke else dict(layers=4, width=256, heads=4,
                                                                                     context=128)
    steps = 8 if args.smoke else args.steps
    model = gpt.GPT(layers=shape["layers"], width=shape["width"], heads=shape["heads"], context=shape["context"])
    tokens = np.zeros((1, shape["context"]), np.int32)
    weights = nn.meta.unbox(model.init(jax.random.key(0), tokens)["params"])  # both runs start from these
    full_bytes, full_step = run(shape, steps, None, weights)
    lora_bytes, lora_step = run(shape, steps, args.rank, weights)
    result = {"state_fraction": lora_bytes / full_bytes, "step_ratio": lora_step / full_step}
    print(f"{'':24}{'full fine-tune':>16}{f'LoRA rank {args.rank}':>16}{'ratio':>10}")
    print(f"{'optimizer state (KiB)':24}{full_bytes / 1024:16.1f}{lora_bytes / 1024:16.1f}{result['state_fraction']:10.3f}")
    print(f"{'step (ms, median)':24}{full_step * 1e3:16.2f}{lora_step * 1e3:16.2f}{result['step_ratio']:10.3f}")
    return result


if __name__ == "__main__":
    main()
