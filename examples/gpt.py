"""Train a GPT-style byte-level language model on the Python documentation that
ships with CPython.

    python examples/gpt.py --preset tiny           # CI-sized: 100 steps
    python examples/gpt.py --preset small          # README's run: 160 steps
    python examples/gpt.py --preset small --strategy fsdp --tensor 2
                                                   # fsdp x tensor (Megatron)
    python examples/gpt.py --preset gpu            # one large GPU
    python examples/gpt.py --preset gpt2-small     # GPT-2 small (124 M): a TPU
    python examples/gpt.py --preset gpt2-medium    # GPT-2 medium (355 M)
    python examples/gpt.py --preset small --resume # exactly from the last save
    python examples/gpt.py --preset small --scan-layers --remat full
                                                   # blocks as one nn.scan
    fitjax fit --config examples/configs/gpt.yaml  # through fitjax's CLI

The corpus is `pydoc_data.topics` (the text behind `help("topics")`, ~465 KB of
English prose and code, part of every CPython install: no download), read as
bytes (vocabulary 256) and split by position: the first 90% trains, the last
10% validates. The model is `fitjax.models.CausalLM` in GPT-2's layout
(`gpt_config`: pre-norm, causal self-attention, GELU MLP, learned positions,
tied input/output embeddings, GPT-2's initialisation; no biases): the library's
decoder, whose attention is `fj.nn.attention` (on a TPU, the Pallas splash
kernel; `--attention` chooses) and whose training loss is
`fj.nn.chunked_cross_entropy` (the tied output layer and its cross-entropy a
chunk of the length at a time, never the whole float32 logits). Its parameters
carry logical axis names and the module declares `fitjax.models.LOGICAL_RULES`
for them, so the same code runs on one device, data-parallel, FSDP, or FSDP ×
tensor parallelism. Every option of the Trainer is on: bf16 mixed precision,
AdamW with warmup-cosine, gradient clipping at 1.0, gradient accumulation,
periodic checkpoints, exact resume.

Logged besides `train/loss` and `val/loss`: `val/ppl` (perplexity, exp of the
validation loss) and `fj.ThroughputMonitor`'s `train/device/items_per_sec`
(tokens per second on each device), `train/device/flops_per_sec` (XLA's FLOP
count of the compiled step; it agrees with PaLM's 6 × matmul parameters + 12 ×
layers × context × width per token, `flops_per_token`) and `train/device/mfu`
on a chip with a known peak (H100, H200, A100, L4, TPU v4-v6e) or with
`--peak-tflops` (a CPU has no standard peak, so on a CPU only the achieved
FLOP/s is reported). Every `--sample-every` steps a few generated lines are
printed and written to TensorBoard's Text tab (`Samples`, a
`fj.GenerationMonitor`): temperature sampling through `Trainer.generate`, which
keeps the keys and values of every layer in a KV cache (`CausalLM.init_cache`,
every layer's stacked), so each new byte is one forward pass over one token.
After training:

    trainer.generate(module, ["def main("], max_new_tokens=60,
                     temperature=0.8, top_p=0.95)
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Sequence

import jax
import numpy as np
import optax

import fitjax as fj
from fitjax import models

# Logical axis names of the model's parameters and activations -> mesh axes of fj.strategies.FSDP:
# the rules shipped with fitjax.models ("embed" over `fsdp`, heads and the MLP's hidden units over
# `tensor`, "batch" over `data` and `fsdp`). GPTModule declares them, so FSDP needs none passed;
# a hand-written loop (benchmarks/gpt.py) uses them itself.
GPT_RULES = models.LOGICAL_RULES

PRESETS: dict[str, dict[str, Any]] = {
    # CI: 100 steps of a 2-layer model (tests/test_gpt.py trains it on 2 busy cores)
    "tiny": dict(layers=2, width=64, heads=4, context=64, batch_size=16, accumulate=2, max_steps=100,
                 lr=3e-3, warmup=10, log_every=10, ckpt_every=50, sample_every=0, precision="bf16-mixed"),
    # the README's CPU run, sized to finish in ~10 minutes on this project's 2 cores shared by 7 people
    # (0.6 M params, 160 steps of 4096 tokens: about 1.5 passes over the training bytes)
    "small": dict(layers=3, width=128, heads=4, context=128, batch_size=16, accumulate=2, max_steps=160,
                  lr=3e-3, warmup=16, log_every=10, ckpt_every=40, sample_every=80, precision="bf16-mixed"),
    # for one large GPU (not run on this project's machines): 10.7 M params, 16 K tokens a step; the
    # corpus has 419 K training bytes, so 600 steps are ~23 passes over it: watch val/loss for overfitting
    "gpu": dict(layers=6, width=384, heads=6, context=256, batch_size=64, accumulate=1, max_steps=600,
                lr=1e-3, warmup=60, log_every=25, ckpt_every=100, sample_every=100, precision="bf16-mixed"),
    # GPT-2 small's and medium's shapes for a TPU chip (not run on this project's machines): the byte
    # vocabulary padded to GPT-2's 50,257 tokens rounded up to a multiple of 128 (`--vocab`), so the
    # parameter count (124 M, 355 M) and the output layer's cost are GPT-2's. 8 rows of 1,024 bytes
    # a step; the corpus' 419 K training bytes are ~100 such steps
    "gpt2-small": dict(layers=12, width=768, heads=12, context=1024, vocab=50304, batch_size=8, accumulate=1,
                       max_steps=300, lr=6e-4, warmup=30, log_every=25, ckpt_every=300, sample_every=0,
                       precision="bf16-mixed"),
    "gpt2-medium": dict(layers=24, width=1024, heads=16, context=1024, vocab=50304, batch_size=8, accumulate=1,
                        max_steps=200, lr=3e-4, warmup=20, log_every=25, ckpt_every=200, sample_every=0,
                        precision="bf16-mixed"),
}
VOCAB = 256  # bytes


# ----------------------------------------------------------------------------------------- model

def gpt_config(*, layers: int, width: int, heads: int, context: int, vocab: int = VOCAB, scan_layers: bool = False,
               attention: str = "auto") -> models.ModelConfig:
    """GPT-2's layout in `fitjax.models` with GPT-2's initialisation (normal(0.02), the projections
    into the residual stream scaled by 1 / sqrt(2 x layers); the positions normal(0.01): the tiny
    preset's validation loss is 2.65 with it, 2.81-2.91 with 0.02), tied embeddings, and no biases
    (LayerNorm scales only). The queries, keys and values are separate projections
    (`fused_qkv=False`), so `FSDP(tensor=...)` splits them by heads."""
    return models.ModelConfig(
        model_type="gpt2", vocab_size=vocab, hidden_size=width, num_layers=layers, num_heads=heads,
        num_kv_heads=heads, head_dim=width // heads, intermediate_size=4 * width, max_position_embeddings=context,
        norm_eps=1e-5, norm="layer", activation="gelu_new", tie_word_embeddings=True,
        layer_types=("full_attention",) * layers, norm_bias=False, fused_qkv=False, init_std=0.02,
        position_init_std=0.01, scale_residual_init=True, scan_layers=scan_layers, attention=attention)


def gpt_model(**shape: Any) -> models.CausalLM:
    """The example's decoder (`gpt_config`'s arguments): `fitjax.models.CausalLM`. Tokens [batch,
    length] -> logits [batch, length, vocab]; with `targets` the `fj.TokenLoss` of predicting them
    (`fj.nn.chunked_cross_entropy`); with a `cache` (`model.init_cache`) `(logits, new_cache)`."""
    return models.CausalLM(gpt_config(**shape))


def flops_per_token(*, layers: int, width: int, context: int, mlp_ratio: int = 4, vocab: int = VOCAB, **_: Any) -> int:
    """Training FLOPs per token (forward + backward = 3 × forward; PaLM's appendix B count).

    6 × the parameters used in matmuls (attention q, k, v, out; the MLP; the tied output head) plus
    12 × layers × context × width for the attention scores and their weighted sum (the causal
    mask's skipped half counted, as PaLM does).
    """
    matmul_params = layers * (4 * width * width + 2 * mlp_ratio * width * width) + vocab * width
    return 6 * matmul_params + 12 * layers * context * width


# ---------------------------------------------------------------------------------------- module

class GPTModule(fj.LitModule):
    """Next-byte prediction: `batch["tokens"]` [batch, context + 1] int32."""

    logical_axis_rules = GPT_RULES  # what fj.strategies.FSDP lays the model out by

    def __init__(self, layers: int = 2, width: int = 64, heads: int = 4, context: int = 64,
                 lr: float = 3e-3, warmup: int = 15, total_steps: int = 150, weight_decay: float = 0.1,
                 scan_layers: bool = False, vocab: int = VOCAB, attention: str = "auto", loss_chunk: int = 256):
        super().__init__()
        self.save_hyperparameters()
        if width % heads:
            raise ValueError(f"GPTModule(width={width!r}, heads={heads!r}): heads must divide width")
        # scan_layers off by default: the presets' 2-6 blocks compile in seconds either way, and
        # `block_i` names are what checkpoints, LoRA targets and weight mappings use; deep models gain
        # (GPT-2 small's step compiled for a TPU slice in 36 s instead of 189 s, benchmarks/plan.py)
        if vocab < VOCAB:
            raise ValueError(f"GPTModule(vocab={vocab!r}): the data holds bytes, so at least {VOCAB}")
        self.model = gpt_model(layers=layers, width=width, heads=heads, context=context, scan_layers=scan_layers,
                               vocab=vocab, attention=attention)
        self.tokenizer = ByteTokenizer()  # text prompts for Trainer.generate
        # model FLOPs (6N + attention) for fj.ThroughputMonitor's MFU and `fitjax plan`
        self.transformer_shape = fj.TransformerShape(layers=layers, width=width, context=context)
        # read by fj.LearningRateMonitor (optax keeps the schedule inside the optimizer)
        self.lr_schedule = optax.warmup_cosine_decay_schedule(0.0, lr, warmup, max(total_steps, warmup + 1),
                                                              end_value=lr / 10)

    def loss(self, model, batch):
        tokens = batch["tokens"]
        # every row holds `context` targets, so the mean over a micro-batch's tokens is exact under
        # accumulation too (a `TokenLoss` returned whole would be the same here)
        return model(tokens[:, :-1], targets=tokens[:, 1:], loss_chunk=self.hparams.loss_chunk).mean

    def configure_optimizer(self):
        decay = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)  # noqa: E731 (no decay on norms)
        return optax.adamw(self.lr_schedule, b1=0.9, b2=0.95, weight_decay=self.hparams.weight_decay, mask=decay)


# ------------------------------------------------------------------------------------------ data

def corpus() -> np.ndarray:
    """The Python documentation topics bundled with CPython, as uint8 bytes (sorted by topic)."""
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[name] for name in sorted(topics))
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8)


def windows(data: np.ndarray, length: int, stride: int) -> np.ndarray:
    """Every `stride`-th slice of `length` bytes, as int32 rows [n, length]."""
    starts = np.arange(0, len(data) - length + 1, stride)
    return data[starts[:, None] + np.arange(length)].astype(np.int32)


def splits(context: int, val_fraction: float = 0.1) -> tuple[dict, dict]:
    """(train, val) dicts of `tokens` [n, context + 1]: train windows overlap by half a context."""
    data = corpus()
    cut = int(len(data) * (1 - val_fraction))
    train = windows(data[:cut], context + 1, max(1, context // 2))
    val = windows(data[cut:], context + 1, context)
    return {"tokens": train}, {"tokens": val}


def encode(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)


def decode(tokens: Sequence[int]) -> str:
    # ids past the bytes (the rows `--vocab` pads the table with) decode to nothing
    return bytes(int(t) for t in tokens if 0 <= int(t) < VOCAB).decode("utf-8", errors="replace")


class GPTData(fj.DataModule):
    """The corpus as windows of `context + 1` bytes (for the CLI: examples/configs/gpt.yaml).

    Args:
        context: bytes the model sees (each row holds one more: the last target).
        batch_size: rows per (micro-)batch; the last partial train batch is dropped.
        seed: the shuffle's seed.
    """

    def __init__(self, context: int = 64, batch_size: int = 16, seed: int = 0):
        self.context, self.batch_size, self.seed = context, batch_size, seed

    def setup(self, stage: str) -> None:
        self.train, self.val = splits(self.context)

    def train_dataloader(self):
        return fj.DataLoader(self.train, batch_size=self.batch_size, shuffle=True, seed=self.seed, drop_last=True)

    def val_dataloader(self):
        return fj.DataLoader(self.val, batch_size=self.batch_size)


# ------------------------------------------------------------------------------------ generation

class ByteTokenizer:
    """Text <-> bytes, as `module.tokenizer` (what `Trainer.generate` encodes text prompts with and
    decodes continuations with; invalid UTF-8 is replaced)."""

    def encode(self, text: str) -> list[int]:
        return encode(text).tolist()

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return decode(ids)


# ------------------------------------------------------------------------------------- callbacks

class Perplexity(fj.Callback):
    """Logs `val/ppl` = exp(`val/loss`) after each validation."""

    def on_validation_epoch_end(self, trainer, module) -> None:
        if "val/loss" in trainer.callback_metrics:
            ppl = float(np.exp(trainer.callback_metrics["val/loss"]))
            for logger in trainer.loggers:
                logger.log_metrics({"val/ppl": ppl}, step=trainer.global_step)


class Samples(fj.GenerationMonitor):
    """Prints generated continuations of a few prompts every `every` steps and at the end, and
    writes them to TensorBoard's Text tab (`fj.GenerationMonitor`: `Trainer.generate` with the
    model's KV cache, one compiled program for every call).

    `every=0`: only at the end; `length=0`: never. A continuation stops at the model's context.
    """

    PROMPTS = ("The ", "def ", "If the ")

    def __init__(self, *, every: int, length: int = 120, temperature: float = 0.8):
        super().__init__(list(self.PROMPTS), every_n_train_steps=every, max_new_tokens=max(length, 1),
                         temperature=temperature)
        self.length, self.temperature = length, temperature

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        if self.length:
            super().on_train_batch_end(trainer, module, outputs, batch, batch_idx)

    def on_train_end(self, trainer, module) -> None:
        if self.length:
            super().on_train_end(trainer, module)

    def sample(self, trainer, module) -> list[str]:
        room = module.hparams.context - max(map(len, self.PROMPTS))  # learned positions end at the context
        self.options = dataclasses.replace(self.options, max_new_tokens=min(self.length, room))
        texts = super().sample(trainer, module)
        self.history[-1] = (trainer.global_step, [p + t for p, t in zip(self.PROMPTS, texts)])
        print(f"\n--- samples at step {trainer.global_step} (temperature {self.temperature}) ---")
        for line in self.history[-1][1]:
            print(repr(line)[1:-1][:160])
        return texts


# ------------------------------------------------------------------------------------------ main

def strategy_for(name: str, *, tensor: int = 1, data: int | None = None) -> str | fj.strategies.Strategy:
    """`"fsdp"` becomes `FSDP(data, tensor)` (laid out by the module's `logical_axis_rules`); other
    names pass through."""
    if name == "fsdp":
        return fj.strategies.FSDP(data=data, tensor=tensor)
    if tensor != 1:
        raise ValueError(f"--tensor {tensor} needs --strategy fsdp (got --strategy {name!r})")
    return name


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    parser.add_argument("--strategy", default="fsdp", help="fsdp (default) | dp | single | auto")
    parser.add_argument("--tensor", type=int, default=1, help="tensor-parallel devices (with fsdp)")
    parser.add_argument("--data", type=int, default=None, help="data-parallel replicas of the fsdp mesh")
    parser.add_argument("--devices", default="auto", help="device count or 'auto'")
    parser.add_argument("--peak-tflops", type=float, default=None, help="the device's peak, for MFU")
    parser.add_argument("--root-dir", default="runs/gpt")
    parser.add_argument("--keep-checkpoints", type=int, default=1, help="periodic checkpoints kept (-1: all)")
    parser.add_argument("--resume", nargs="?", const="last", default=None, metavar="CKPT",
                        help="continue exactly from a checkpoint: the last one (no value), or a path")
    parser.add_argument("--no-progress-bar", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sample-length", type=int, default=120, help="bytes per printed sample (0: none)")
    parser.add_argument("--remat", default="none", choices=["none", "full", "dots", "offload"],
                        help="recompute each block's activations in the backward pass (Trainer(remat=...))")
    parser.add_argument("--scan-layers", action="store_true",
                        help="run the blocks as one nn.scan over stacked parameters: XLA compiles one block")
    parser.add_argument("--vocab", type=int, default=None,
                        help=f"output rows (default {VOCAB}, the bytes; more pads the table, e.g. GPT-2's 50304)")
    parser.add_argument("--attention", default="auto", choices=["auto", "xla", "pallas", "pallas-fused", "cudnn"],
                        help="fj.nn.attention's implementation (auto: the platform's kernel where it applies)")
    parser.add_argument("--loss-chunk", type=int, default=256,
                        help="positions per chunk of fj.nn.chunked_cross_entropy (the training loss)")
    # every preset value can be overridden: --layers 6 --width 384 --max-steps 1000 ...
    for key, value in PRESETS["tiny"].items():
        parser.add_argument(f"--{key.replace('_', '-')}", type=type(value), default=None)
    args = parser.parse_args(argv)
    for key, value in PRESETS[args.preset].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.vocab = args.vocab or VOCAB
    return args


@dataclasses.dataclass
class Run:
    """What `main` returns: the trainer and module after fit, the final metrics, the callbacks."""

    trainer: fj.Trainer
    module: GPTModule
    metrics: dict[str, float]
    throughput: fj.ThroughputMonitor
    samples: Samples


def main(argv: Sequence[str] | None = None, *, callbacks: Sequence[fj.Callback] = ()) -> Run:
    args = parse_args(argv)
    train, val = splits(args.context)
    global_batch = args.batch_size  # per micro-batch; an optimizer step sees `accumulate` of them
    train_loader = fj.DataLoader(train, batch_size=global_batch, shuffle=True, seed=args.seed, drop_last=True)
    val_loader = fj.DataLoader(val, batch_size=global_batch)
    module = GPTModule(layers=args.layers, width=args.width, heads=args.heads, context=args.context,
                       lr=args.lr, warmup=args.warmup, total_steps=args.max_steps, scan_layers=args.scan_layers,
                       vocab=args.vocab, attention=args.attention, loss_chunk=args.loss_chunk)
    # a row holds `context + 1` bytes: `context` of them are trained on (inputs, shifted targets)
    throughput = fj.ThroughputMonitor(batch_size_fn=lambda batch: batch["tokens"].shape[0],
                                      length_fn=lambda batch: batch["tokens"].shape[0] * args.context,
                                      window_size=2 * args.log_every * args.accumulate,
                                      peak_flops=args.peak_tflops * 1e12 if args.peak_tflops else None)
    samples = Samples(every=args.sample_every, length=args.sample_length)
    started = _StartStep()
    checkpoints = fj.ModelCheckpoint(every_n_train_steps=args.ckpt_every, save_last=True,
                                     save_top_k=args.keep_checkpoints)
    trainer = fj.Trainer(
        max_steps=args.max_steps,
        strategy=strategy_for(args.strategy, tensor=args.tensor, data=args.data),
        devices=args.devices if args.devices == "auto" else int(args.devices),
        precision=args.precision,
        accumulate_grad_batches=args.accumulate,
        remat=args.remat,
        gradient_clip_val=1.0,
        log_every_n_steps=args.log_every,
        val_check_interval=args.ckpt_every * args.accumulate,  # batches: validate at each checkpoint
        check_val_every_n_epoch=None,
        limit_val_batches=20,
        default_root_dir=args.root_dir,
        enable_progress_bar=not args.no_progress_bar,
        seed=args.seed,
        callbacks=[checkpoints, throughput, samples, Perplexity(), fj.LearningRateMonitor(), started, *callbacks],
    )
    trainer.fit(module, train_loader, val_loader, ckpt_path=args.resume)
    if started.step is not None and started.step >= args.max_steps:
        print(f"nothing left to train: the checkpoint is at step {started.step} and --max-steps is "
              f"{args.max_steps}; pass a larger --max-steps to train on (or leave out --resume to start over).")
    (metrics,) = trainer.validate(module, val_loader)
    metrics = {**metrics, "val/ppl": float(np.exp(metrics["val/loss"]))}
    speed = {k: v for k, v in throughput.metrics.items() if k.endswith("_per_sec") or k.endswith("mfu")}
    metrics.update(speed)  # the last log step's rates (over its window)
    scope = "train/" if "train/items_per_sec" in speed else "train/device/"  # all devices, else the one
    tokens, flops = speed.get(scope + "items_per_sec"), speed.get(scope + "flops_per_sec")
    print(f"validation loss {metrics['val/loss']:.4f}  perplexity {metrics['val/ppl']:.3f}  "
          + (f"{tokens:.0f} tokens/s  " if tokens else "")
          + (f"{flops / 1e9:.2f} GFLOP/s achieved  " if flops else "")
          + f"(logs: {trainer.log_dir})")
    return Run(trainer, module, metrics, throughput, samples)


class _StartStep(fj.Callback):
    """The global step a fit starts from (after a resume): whether there was anything left to train."""

    step: int | None = None

    def on_fit_start(self, trainer, module) -> None:
        self.step = trainer.global_step


if __name__ == "__main__":
    main()
