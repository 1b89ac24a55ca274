"""Packing against padding: real (non-padding) tokens trained per second on a length-skewed corpus.

    python benchmarks/packing.py            # seq_len 256, batch 8, 2 layers of width 128, 30 timed steps each
    python benchmarks/packing.py --smoke    # seconds: checks it runs (numbers mean nothing)

The corpus: 4,000 records of random words whose lengths follow a log-normal law (median 30 words,
clipped to [2, seq_len]): most examples are short, a few fill a row, as in chat and instruction
data. Both runs are `fj.Trainer.fit` of the same small causal LM (`fj.nn.attention` with the
batch's `segment_ids`, learned positions from the batch's `positions`, `fj.TokenLoss`) on
`fj.data.TextLoader` over the same JSONL file: `pack=True` (first-fit packing, segment masks) or
`pack=False` (one example per row, padded). A step's time: the median wall time between
consecutive `on_train_batch_end` calls after the first 5 (compilation left out), the device synced
at each; real tokens per step: the mean count of `segment_ids > 0` over the timed batches, so the
loader's own time counts too. The issue's bar: packed / padded real tokens per second >= 1.5.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="a tiny model and a few steps: checks it runs")
    parser.add_argument("--steps", type=int, default=36)
    return parser


if __name__ == "__main__":  # --help (or a wrong argument) answered before JAX is imported
    _parser().parse_args()


import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import fitjax as fj  # noqa: E402

WORDS = [f"w{i}" for i in range(500)]


class LM(nn.Module):
    vocab: int
    seq_len: int
    width: int
    layers: int
    heads: int = 4

    @nn.compact
    def __call__(self, tokens, positions, segment_ids):
        batch, length = tokens.shape
        x = nn.Embed(self.vocab, self.width)(tokens) + nn.Embed(self.seq_len, self.width)(positions)
        for _ in range(self.layers):
            q, k, v = jnp.split(nn.Dense(3 * self.width)(nn.LayerNorm()(x)), 3, axis=-1)
            shape = (batch, length, self.heads, self.width // self.heads)
            att = fj.nn.attention(q.reshape(shape), k.reshape(shape), v.reshape(shape), segment_ids=segment_ids)
            x = x + nn.Dense(self.width)(att.reshape(batch, length, self.width))
            x = x + nn.Dense(self.width)(nn.gelu(nn.Dense(4 * self.width)(nn.LayerNorm()(x))))
        return nn.Dense(self.vocab)(nn.LayerNorm()(x))


class Module(fj.LitModule):
    def __init__(self, **shape):
        super().__init__()
        self.model = LM(**shape)

    def loss(self, model, batch):
        logits = model(batch["tokens"], batch["positions"], batch["segment_ids"])
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"])
        return fj.TokenLoss(sum=(ce * batch["loss_mask"]).sum(), count=batch["loss_mask"].sum())

    def configure_optimizer(self):
        return optax.adamw(1e-3)


class Times(fj.Callback):
    def __init__(self):
        self.times: list[float] = []
        self.real: list[int] = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        jax.block_until_ready(trainer.state.params)
        self.times.append(time.perf_counter())
        self.real.append(int((np.asarray(batch["segment_ids"]) > 0).sum()))


def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {word: i for i, word in enumerate(["<pad>", "</s>", *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tok


def corpus(path: str, records: int, seq_len: int, median: int) -> None:
    rng = np.random.default_rng(0)
    lengths = np.clip(rng.lognormal(np.log(median), 1.0, records).astype(int), 2, seq_len)
    with open(path, "w") as f:
        for n in lengths:
            f.write(json.dumps({"text": " ".join(rng.choice(WORDS, n))}) + "\n")


def run(path: str, *, pack: bool, steps: int, batch_size: int, shape: dict) -> tuple[float, float]:
    """(real tokens per second, packing efficiency) of one fit."""
    loader = fj.data.TextLoader(path, tokenizer=tokenizer(), seq_len=shape["seq_len"], batch_size=batch_size,
                                pack=pack, shuffle=True)
    times = Times()
    trainer = fj.Trainer(max_steps=steps, strategy="single", enable_progress_bar=False, logger=False,
                         enable_model_summary=False, enable_checkpointing=False, callbacks=[times])
    trainer.fit(Module(vocab=len(WORDS) + 2, **shape), loader)
    step = statistics.median(np.diff(times.times[5:]))
    real = float(np.mean(times.real[6:]))
    return real / step, real / (batch_size * shape["seq_len"])


def main(argv=None) -> dict[str, float]:
    args = _parser().parse_args(argv)
    if args.smoke:
        shape, steps, batch_size, records, median = dict(seq_len=64, width=32, layers=1), 9, 4, 300, 8
    else:
        shape, steps, batch_size, records, median = dict(seq_len=256, width=128, layers=2), args.steps, 8, 4000, 30
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "corpus.jsonl")
        corpus(path, records, shape["seq_len"], median)
        padded, padded_efficiency = run(path, pack=False, steps=steps, batch_size=batch_size, shape=shape)
        packed, packed_efficiency = run(path, pack=True, steps=steps, batch_size=batch_size, shape=shape)
    print(f"{'':10}{'real tokens/s':>16}{'real / slots':>14}")
    print(f"{'padded':10}{padded:16.0f}{padded_efficiency:14.3f}")
    print(f"{'packed':10}{packed:16.0f}{packed_efficiency:14.3f}")
    print(f"packed / padded real tokens/s: {packed / padded:.2f}x (bar: 1.5x)")
    return {"ratio": packed / padded, "packed_efficiency": packed_efficiency, "padded_efficiency": padded_efficiency}


if __name__ == "__main__":
    main()
