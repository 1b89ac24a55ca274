r"""Fine-tune the GPT example with LoRA on new text: start from a saved model,
train small adapters, keep them (a small file) and export the merged model.

    python examples/gpt.py --preset tiny
                              # a base: runs/gpt/.../checkpoints
    python examples/finetune_lora.py \
        --base runs/gpt/fitjax_logs/version_0/checkpoints/last
    python examples/finetune_lora.py --base path/to/hf_folder
                              # a Hugging Face model (fitjax.models)
    python examples/finetune_lora.py
                              # no base: trains one first (tiny)

The base model learned English prose (the Python documentation topics,
examples/gpt.py); the new text is Python code: the source of the standard
library's `json` package, which every CPython ships (no download), read as
bytes like the base's corpus. Rank-`--rank` adapters go on the attention's
query and value and on the MLP of every block (`--targets`); the base weights
stay as they were and hold no optimizer state. At the end the script prints
the validation loss before and after, the adapter file's size against the full
model's, and the checkpoint of the adapters
(`ModelCheckpoint(weights="trainable")`: adapters, their optimizer state, the
loop position) against one of the whole train state.
"""

from __future__ import annotations

import argparse
import dataclasses
import json as json_package
from pathlib import Path
from typing import Any, Sequence

import numpy as np

import fitjax as fj
from fitjax import models
import gpt  # examples/gpt.py


def new_text() -> np.ndarray:
    """The source files of the `json` package, concatenated, as uint8 bytes."""
    files = sorted(Path(json_package.__file__).parent.glob("*.py"))
    return np.frombuffer(b"\n\n".join(f.read_bytes() for f in files), dtype=np.uint8)


def base_module(base: str | None, args: argparse.Namespace) -> fj.LitModule:
    """The module to adapt: a fitjax checkpoint of examples/gpt.py, a Hugging Face folder, or
    (None) a tiny GPT trained here first on the documentation topics."""
    if base is None:
        run = gpt.main(["--preset", "tiny", "--max-steps", str(args.base_steps), "--strategy", args.strategy,
                        "--root-dir", str(Path(args.root_dir) / "base"), "--sample-length", "0",
                        "--no-progress-bar", "--precision", "32-true"])
        return run.module
    path = Path(base)
    if (path / "config.json").is_file():
        return models.from_pretrained(path, lr=args.lr)
    return gpt.GPTModule.load_from_checkpoint(path, lr=args.lr, warmup=1, total_steps=args.steps)


@dataclasses.dataclass
class Result:
    """What `main` returns: the losses before and after, the file sizes, the adapted module."""

    val_loss_before: float
    val_loss_after: float
    adapter_bytes: int
    full_bytes: int
    checkpoint_bytes: int  # ModelCheckpoint(weights="trainable")
    full_checkpoint_bytes: int  # the whole train state
    module: Any


def main(argv: Sequence[str] | None = None) -> Result:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default=None, help="a fitjax checkpoint of examples/gpt.py or a HF folder")
    parser.add_argument("--base-steps", type=int, default=60, help="steps of the base trained without --base")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--targets", default=r".*(q_proj|v_proj|c_attn|c_fc|mlp/c_proj|up_proj|down_proj)",
                        help="regex on the layers' module paths")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--strategy", default="auto")
    parser.add_argument("--root-dir", default="runs/finetune_lora")
    args = parser.parse_args(argv)

    module = base_module(args.base, args)
    # a Hugging Face model's longest context can be 128k tokens: windows of at most 256
    context = getattr(module.hparams, "context", None) or min(256, module.model.config.max_position_embeddings - 1)
    data = new_text()
    cut = int(len(data) * 0.9)
    train = {"tokens": gpt.windows(data[:cut], context + 1, max(1, context // 2))}
    val = {"tokens": gpt.windows(data[cut:], context + 1, context)}
    val_loader = fj.DataLoader(val, batch_size=args.batch_size)
    trainer_args = dict(strategy=args.strategy, enable_progress_bar=False, logger=False, default_root_dir=args.root_dir)

    (before,) = fj.Trainer(enable_checkpointing=False, **trainer_args).validate(module, val_loader, verbose=False)
    module.apply_lora(args.targets, rank=args.rank)
    out = Path(args.root_dir)
    # the adapters, their optimizer state and the loop position: resumes this fit given the same base
    adapters_only = fj.ModelCheckpoint(out / "checkpoints", weights="trainable")
    trainer = fj.Trainer(max_steps=args.steps, callbacks=[adapters_only], **trainer_args)
    trainer.fit(module, fj.DataLoader(train, batch_size=args.batch_size, shuffle=True, drop_last=True))
    trainer.save_checkpoint(out / "full_checkpoint")  # the whole state, base included, to compare
    (after,) = trainer.validate(module, val_loader, verbose=False)

    out.mkdir(parents=True, exist_ok=True)
    module.save_weights(out / "adapters.safetensors", lora="adapters")
    module.save_weights(out / "merged.safetensors")  # what a plain GPTModule.load_weights reads
    adapter_bytes, full_bytes = ((out / f).stat().st_size for f in ("adapters.safetensors", "merged.safetensors"))
    print(f"val/loss on the new text: {before['val/loss']:.3f} before, {after['val/loss']:.3f} after "
          f"{args.steps} LoRA steps (rank {args.rank})")
    print(f"adapters: {adapter_bytes / 1024:.1f} KiB, {adapter_bytes / full_bytes:.1%} of the full model's "
          f"{full_bytes / 1024:.1f} KiB ({out / 'adapters.safetensors'}, {out / 'merged.safetensors'})")
    ckpt_bytes, full_ckpt_bytes = folder_bytes(adapters_only.last_model_path), folder_bytes(out / "full_checkpoint")
    print(f"checkpoint of the adapters: {ckpt_bytes / 1024:.1f} KiB, {ckpt_bytes / full_ckpt_bytes:.1%} of the "
          f"whole state's {full_ckpt_bytes / 1024:.1f} KiB ({adapters_only.last_model_path})")
    return Result(before["val/loss"], after["val/loss"], adapter_bytes, full_bytes, ckpt_bytes, full_ckpt_bytes,
                  module)


def folder_bytes(path: str | Path) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


if __name__ == "__main__":
    main()
