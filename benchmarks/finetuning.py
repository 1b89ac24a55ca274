"""What a frozen backbone costs: `BackboneFinetuning` against `fj.param_groups` with the backbone None.

    python benchmarks/finetuning.py            # backbone 3 x Dense(1024), head Dense(10), Adam, 12 steps each
    python benchmarks/finetuning.py --smoke    # seconds: checks it runs (numbers mean nothing)

Three fits of the same model and data, one epoch each, the backbone frozen throughout:
"full": every parameter trains (the reference); "BackboneFinetuning": the callback freezes the
backbone (unfreezing at epoch 1, after this fit's end): the step's update scales make the
backbone's update 0, but its gradient is computed (then zeroed) and Adam's two moments exist for
it, because a group unfrozen later in the same compiled program needs them; "param_groups None":
the backbone frozen by the optimizer (`fitjax.step.trainable`), so the step differentiates the
head alone and holds state for it alone. Printed: the optimizer state's bytes after the fit,
XLA's FLOPs per step (`trainer.train_step_flops()`, exact) and the median step time (noisy on a
shared machine).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--steps", type=int, default=12)
    return parser


if __name__ == "__main__":  # --help (or a wrong argument) answered before JAX is imported
    _parser().parse_args()


import flax.linen as nn
import jax
import numpy as np
import optax

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import fitjax as fj  # noqa: E402
from lora import StepTimes  # noqa: E402  (benchmarks/lora.py: FLOPs at fit start, a time per step)


class Net(nn.Module):
    width: int
    depth: int

    def setup(self):
        self.backbone = nn.Sequential([layer for _ in range(self.depth) for layer in (nn.Dense(self.width), nn.relu)])
        self.head = nn.Dense(10)

    def __call__(self, x):
        return self.head(self.backbone(x))


class Classifier(fj.LitModule):
    def __init__(self, width: int, depth: int, frozen_by_optimizer: bool):
        super().__init__()
        self.model = Net(width, depth)
        self.frozen_by_optimizer = frozen_by_optimizer

    def loss(self, model, batch):
        return optax.softmax_cross_entropy_with_integer_labels(model(batch["x"]), batch["y"]).mean()

    def configure_optimizer(self):
        if self.frozen_by_optimizer:
            return fj.param_groups({r"backbone\..*": None, r"head\..*": optax.adam(1e-3)})
        return optax.adam(1e-3)


def run(how: str, width: int, depth: int, steps: int) -> tuple[int, float, float]:
    rng = np.random.default_rng(0)
    data = {"x": rng.normal(size=(64 * steps, width)).astype(np.float32),
            "y": rng.integers(0, 10, size=64 * steps).astype(np.int32)}
    times = StepTimes()
    callbacks = [times] + ([fj.BackboneFinetuning(unfreeze_backbone_at_epoch=1)] if how == "BackboneFinetuning" else [])
    trainer = fj.Trainer(max_epochs=1, strategy="single", enable_progress_bar=False, logger=False,
                         enable_checkpointing=False, enable_model_summary=False, callbacks=callbacks)
    trainer.fit(Classifier(width, depth, how == "param_groups None"), fj.DataLoader(data, batch_size=64))
    state_bytes = sum(np.asarray(x).nbytes for x in jax.tree.leaves(jax.device_get(trainer.state.opt_state)))
    gaps = np.diff(times.times[2:]) if len(times.times) > 3 else np.diff(times.times)
    return state_bytes, times.flops or float("nan"), float(statistics.median(gaps))


def main(argv=None) -> dict[str, float]:
    args = _parser().parse_args(argv)
    width, depth, steps = (64, 2, 4) if args.smoke else (1024, 3, args.steps)
    runs = {how: run(how, width, depth, steps) for how in ("full", "BackboneFinetuning", "param_groups None")}
    print(f"{'':24}" + "".join(f"{name:>20}" for name in runs))
    for row, index, unit in (("optimizer state (KiB)", 0, 1024), ("MFLOPs per step", 1, 1e6),
                             ("step (ms, median)", 2, 1e-3)):
        print(f"{row:24}" + "".join(f"{values[index] / unit:20.2f}" for values in runs.values()))
    (full_bytes, full_flops, _), (bf_bytes, bf_flops, bf_step), (pg_bytes, pg_flops, pg_step) = runs.values()
    result = {"backbone_finetuning_state": bf_bytes / full_bytes, "param_groups_state": pg_bytes / full_bytes,
              "flops_param_groups_vs_backbone_finetuning": pg_flops / bf_flops,
              "step_param_groups_vs_backbone_finetuning": pg_step / bf_step}
    print(", ".join(f"{k} {v:.3f}" for k, v in result.items()))
    return result


if __name__ == "__main__":
    main()
