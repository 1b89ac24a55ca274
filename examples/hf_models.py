r"""Fine-tune a Hugging Face model folder with fitjax and write it back as a
folder `transformers` loads: GPT-2, Llama 3.x, Mistral, Qwen 2.5/3 and Gemma
2/3 (`fitjax.models`).

    python examples/hf_models.py --model path/to/Qwen2.5-0.5B \
        --root-dir runs/hf_models/out
    python examples/hf_models.py --model path/to/Llama-3.2-1B --lora 8 \
        --strategy fsdp

The text is the source of Python's `json` package (every CPython ships it: no
download), cut into windows of `--context` tokens by the folder's own
tokenizer (`tokenizer.json`, read by the `tokenizers` package) or, for a
folder without one, as bytes. The script prints the validation loss before and
after `--steps` steps and writes the fine-tuned model (LoRA adapters merged
in) with `fitjax.models.save_pretrained`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json as json_package
from pathlib import Path
from typing import Sequence

import numpy as np

import fitjax as fj
from fitjax import models


def text_tokens(folder: Path, vocab_size: int) -> np.ndarray:
    """The `json` package's source as token ids: the folder's tokenizer's, else bytes."""
    files = sorted(Path(json_package.__file__).parent.glob("*.py"))
    text = "\n\n".join(f.read_text() for f in files)
    if (folder / "tokenizer.json").is_file():
        import tokenizers  # installed with transformers

        return np.asarray(tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json")).encode(text).ids, np.int32)
    if vocab_size < 256:
        raise ValueError(f"--model {str(folder)!r} has no tokenizer.json and {vocab_size} tokens, too few for bytes.")
    return np.frombuffer(text.encode(), np.uint8).astype(np.int32)


def windows(tokens: np.ndarray, length: int, stride: int) -> np.ndarray:
    starts = np.arange(0, len(tokens) - length + 1, stride)
    return tokens[starts[:, None] + np.arange(length)]


@dataclasses.dataclass
class Result:
    """What `main` returns: the validation losses before and after, the module, the folder written."""

    val_loss_before: float
    val_loss_after: float
    module: models.CausalLMModule
    out: Path


def main(argv: Sequence[str] | None = None) -> Result:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a Hugging Face folder (config.json, *.safetensors)")
    parser.add_argument("--root-dir", "--out", dest="out", default="runs/hf_models/out", metavar="DIR",
                        help="where the logs, checkpoints and the exported model go")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--lora", type=int, default=0, help="LoRA rank (0: train every weight)")
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--strategy", default="auto")
    args = parser.parse_args(argv)

    folder = Path(args.model)
    module = models.from_pretrained(folder, lr=args.lr)
    config = module.model.config
    context = min(args.context, config.max_position_embeddings - 1)
    tokens = text_tokens(folder, config.vocab_size)
    cut = int(len(tokens) * 0.9)
    train = fj.DataLoader({"tokens": windows(tokens[:cut], context + 1, max(1, context // 2))},
                          batch_size=args.batch_size, shuffle=True, drop_last=True)
    val = fj.DataLoader({"tokens": windows(tokens[cut:], context + 1, context)}, batch_size=args.batch_size)
    trainer_args = dict(strategy=args.strategy, enable_progress_bar=False, logger=False, enable_checkpointing=False)

    (before,) = fj.Trainer(**trainer_args).validate(module, val, verbose=False)
    if args.lora:
        module.apply_lora(r".*(q_proj|k_proj|v_proj|o_proj|c_attn)", rank=args.lora)
    trainer = fj.Trainer(max_steps=args.steps, **trainer_args)
    trainer.fit(module, train)
    (after,) = trainer.validate(module, val, verbose=False)
    models.save_pretrained(module, args.out)
    print(f"{config.model_type}: val/loss {before['val/loss']:.3f} before, {after['val/loss']:.3f} after "
          f"{args.steps} steps{f' (LoRA rank {args.lora})' if args.lora else ''}; written to {args.out}")
    return Result(before["val/loss"], after["val/loss"], module, Path(args.out))


if __name__ == "__main__":
    main()
