"""Instruction-tune a small Llama: chat records from a JSONL file, packed into
full rows, only the assistant's answers learned, LoRA adapters, samples
generated at each validation, and a Hugging Face folder at the end that
`transformers` loads.

    pip install -e ".[lm]"         # tokenizers, transformers, grain, jinja2,
                                   # qwix, ...
    python examples/sft.py         # about a minute on CPU
    python examples/sft.py --root-dir runs/sft
                                   # where the data, tokenizer, logs and model
                                   # go
    python examples/sft.py --base-steps 12 --steps 12 --seq-len 64
                                   # the smallest run (CI's)

Everything is made here, nothing downloaded: the data (two tasks over a small
vocabulary, "reverse: red cat sat" -> "sat cat red" and "repeat: ..." -> the
same words, lengths skewed short as chat data is), a word-level tokenizer
trained on it with `tokenizers` and saved with a chat template
(`transformers`' `PreTrainedTokenizerFast`), and a Llama from a config dict.
The run has two fits: the base learns the language from the chats read whole
(every token, full weights), then LoRA adapters are instruction-tuned with
`completion_only=True` (system and user turns are read, not learned).
`fj.data.TextLoader` packs both; `train/packing_efficiency` is logged.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

import fitjax as fj
from fitjax import models

WORDS = "red blue green cat dog bird sat ran flew on under the a mat log tree fast slow big small".split()
SYSTEM = "you follow the task"
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|> {% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|> {% endif %}")


def chat(rng: np.random.Generator) -> dict:
    """One record: a task on 1 to 12 words, short ones most often."""
    words = list(rng.choice(WORDS, size=int(min(12, 1 + rng.geometric(0.3)))))
    task = str(rng.choice(["reverse", "repeat"]))
    answer = words[::-1] if task == "reverse" else words
    return {"messages": [{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": f"{task} : {' '.join(words)}"},
                         {"role": "assistant", "content": " ".join(answer)}]}


def write_data(folder: Path, train: int = 3000, val: int = 64) -> tuple[Path, Path]:
    rng = np.random.default_rng(0)
    for name, count in (("train.jsonl", train), ("val.jsonl", val)):
        (folder / name).write_text("".join(json.dumps(chat(rng)) + "\n" for _ in range(count)))
    return folder / "train.jsonl", folder / "val.jsonl"


def train_tokenizer(data: Path, folder: Path):
    """A word-level tokenizer trained on `data`'s messages, saved with a chat template."""
    from tokenizers import Tokenizer, models as tok_models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
    core = Tokenizer(tok_models.WordLevel(unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    texts = [m["content"] for line in data.read_text().splitlines() for m in json.loads(line)["messages"]]
    core.train_from_iterator(texts, trainers.WordLevelTrainer(special_tokens=specials))
    # a turn ends with <|end|>: the token generation stops at (chat models' EOS, as Qwen's <|im_end|>)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="<|end|>", pad_token="<pad>",
                                        unk_token="<unk>", additional_special_tokens=specials[3:])
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    return tokenizer


def llama_config(tokenizer, seq_len: int) -> dict:
    return {"model_type": "llama", "vocab_size": len(tokenizer), "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "max_position_embeddings": seq_len, "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}


class SamplesAtValidation(fj.GenerationMonitor):
    """Generates the prompts' continuations at the end of each validation (not the sanity check)."""

    def on_validation_end(self, trainer, module) -> None:
        if not trainer.sanity_checking:
            self.sample(trainer, module)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root-dir", "--out", dest="out", default=None, metavar="DIR",
                        help="folder for the data, tokenizer, logs and model (default: a temp folder)")
    parser.add_argument("--base-steps", type=int, default=150, help="steps of the base model on whole chats")
    parser.add_argument("--steps", type=int, default=150, help="LoRA instruction-tuning steps")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--rank", type=int, default=16, help="LoRA rank")
    args = parser.parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="fitjax-sft-"))
    out.mkdir(parents=True, exist_ok=True)

    train_file, val_file = write_data(out)
    tokenizer = train_tokenizer(train_file, out / "tokenizer")

    def loader(path: Path, *, completion_only: bool, shuffle: bool) -> fj.data.TextLoader:
        return fj.data.TextLoader(path, tokenizer=tokenizer, seq_len=args.seq_len, batch_size=args.batch_size,
                                  completion_only=completion_only, shuffle=shuffle)

    module = models.CausalLMModule(llama_config(tokenizer, args.seq_len), lr=3e-3)
    module.tokenizer = tokenizer  # text prompts in and text out of `Trainer.generate`
    logger = fj.TensorBoardLogger(str(out / "logs"))
    # 1. the base: whole chats, every token learned, all the weights trained
    print(f"1/3 the base model: {args.base_steps} steps on whole chats, every token learned")
    base = fj.Trainer(max_steps=args.base_steps, logger=logger, enable_checkpointing=False, log_every_n_steps=10,
                      limit_val_batches=0)
    base.fit(module, loader(train_file, completion_only=False, shuffle=True))

    # 2. instruction tuning: LoRA adapters, the answers alone learned, samples at each validation
    module.apply_lora(r".*(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)", rank=args.rank)
    prompts = [tokenizer.apply_chat_template([{"role": "system", "content": SYSTEM}, {"role": "user", "content": p}],
                                             tokenize=False, add_generation_prompt=True)
               for p in ("reverse : big red dog ran", "repeat : the bird flew under a tree")]
    samples = SamplesAtValidation(prompts, every_n_train_steps=0, max_new_tokens=12, temperature=0.0)
    val_data = loader(val_file, completion_only=True, shuffle=False)
    tuner = fj.Trainer(max_steps=args.steps, logger=logger, callbacks=[samples], enable_checkpointing=False,
                       val_check_interval=max(args.steps // 2, 1), check_val_every_n_epoch=None, log_every_n_steps=10)
    print(f"2/3 LoRA adapters (rank {args.rank}): {args.steps} steps on the answers alone")
    before = tuner.validate(module, val_data, verbose=False)[0]["val/loss"]
    train_data = loader(train_file, completion_only=True, shuffle=True)
    tuner.fit(module, train_data, val_data)
    after = tuner.callback_metrics["val/loss"]

    # 3. a Hugging Face folder: the adapters merged into the weights, the tokenizer beside them
    print("3/3 writing the Hugging Face folder")
    models.save_pretrained(module, out / "model")
    tokenizer.save_pretrained(out / "model")
    result = {"val_loss_before": float(before), "val_loss_after": float(after),
              "packing_efficiency": float(tuner.callback_metrics["train/packing_efficiency"]),
              "samples": samples.history[-1][1], "model": str(out / "model"), "log_dir": logger.log_dir}
    print(f"answer loss (validation): {result['val_loss_before']:.3f} before LoRA, {result['val_loss_after']:.3f} after")
    print(f"packing efficiency (real tokens / row slots): {result['packing_efficiency']:.3f}")
    for prompt, sample in zip(prompts, result["samples"]):
        print(f"{prompt!r} -> {sample!r}")
    print(f"model and tokenizer written to {result['model']} (transformers.AutoModelForCausalLM.from_pretrained)")
    return result


if __name__ == "__main__":
    main()
