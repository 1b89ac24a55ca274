"""Language models people fine-tune, at their real shapes, trained by `fitjax.models` on one device.

    python benchmarks/lm_shapes.py --device --shape qwen2.5-0.5b                 # full fine-tune, bf16-mixed
    python benchmarks/lm_shapes.py --device --shape llama-3.2-1b --lora 16       # LoRA rank 16 on every projection
    python benchmarks/lm_shapes.py --device --shape qwen2.5-0.5b --scan-layers --remat dots
    python benchmarks/lm_shapes.py --smoke                                       # seconds on CPU (numbers mean nothing)

Each run builds a `fitjax.models.CausalLMModule` from the architecture's `config.json` values
(`SHAPES`; random weights: nothing is downloaded) and fits it with `Trainer(precision="bf16-mixed")`
on random tokens, `--batch` rows of `--length` tokens a step, bar, logger and checkpoints off. It
times optimizer steps `--warmup`..`--warmup + --steps` (the first ones compile) and reports
tokens/s, the step's time, the device's peak memory (`memory_stats()`) and the model FLOP
utilisation:

    MFU = tokens/s x FLOPs per token / the device kind's peak (fitjax.planner.spec_for)
    FLOPs per token, full fine-tune: 6 N + 12 L d T      (PaLM's: N the matmul parameters, the
                                                         output layer included, the token table's
                                                         lookup not; L layers, d = heads x head_dim,
                                                         T the length: attention's scores)
    with LoRA:                       4 N + 6 N_lora + 12 L d T   (no gradient for the frozen weights)

`--scan-layers` and `--attention` are `CausalLMModule`'s options of those names, `--remat` the
Trainer's; `--set key=value` adds or replaces a key of the architecture's config dict; `--lora
RANK` applies LoRA to every attention and MLP projection. `--json` writes the figures with the
command, commit and machine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
SHAPES = {  # the published config.json values of each architecture
    "qwen2.5-0.5b": {"model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864,
                     "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
                     "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
                     "tie_word_embeddings": True, "use_sliding_window": False},
    "llama-3.2-1b": {"model_type": "llama", "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192,
                     "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
                     "head_dim": 64, "max_position_embeddings": 131072, "rope_theta": 500000.0,
                     "rms_norm_eps": 1e-5, "tie_word_embeddings": True, "rope_scaling": LLAMA3_ROPE},
    "llama-3.2-3b": {"model_type": "llama", "vocab_size": 128256, "hidden_size": 3072, "intermediate_size": 8192,
                     "num_hidden_layers": 28, "num_attention_heads": 24, "num_key_value_heads": 8,
                     "head_dim": 128, "max_position_embeddings": 131072, "rope_theta": 500000.0,
                     "rms_norm_eps": 1e-5, "tie_word_embeddings": True, "rope_scaling": LLAMA3_ROPE},
    "llama-3.1-8b": {"model_type": "llama", "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
                     "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                     "head_dim": 128, "max_position_embeddings": 131072, "rope_theta": 500000.0,
                     "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
                     "rope_scaling": {**LLAMA3_ROPE, "factor": 8.0}},
    # seconds on a CPU: the same code path, nothing measured
    "smoke": {"model_type": "qwen2", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
              "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
              "max_position_embeddings": 256, "tie_word_embeddings": True},
}
LORA_TARGETS = r".*(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", action="store_true", help="run on the accelerator JAX finds (default: CPU)")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-0.5b")
    parser.add_argument("--batch", type=int, default=8, help="rows a step")
    parser.add_argument("--length", type=int, default=1024, help="tokens a row")
    parser.add_argument("--lora", type=int, default=None, metavar="RANK", help="LoRA of this rank (base frozen)")
    parser.add_argument("--scan-layers", action="store_true", help="the layers as one nn.scan")
    parser.add_argument("--attention", default="auto", help="fj.nn.attention's implementation (default auto)")
    parser.add_argument("--remat", default="none", help="Trainer(remat=...): none, full, dots or offload")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config.json key (JSON value: true, 4, \"x\"), e.g. num_hidden_layers=4")
    parser.add_argument("--warmup", type=int, default=3, help="untimed optimizer steps first (compilation)")
    parser.add_argument("--steps", type=int, default=10, help="timed optimizer steps")
    parser.add_argument("--peak-tflops", type=float, default=None, help="the device's peak (default: fitjax's table)")
    parser.add_argument("--json", default=None, help="write the figures here as JSON")
    parser.add_argument("--smoke", action="store_true", help="a tiny shape, 1 + 1 steps on CPU: checks it runs")
    return parser


if __name__ == "__main__":  # --help answered before JAX is imported
    _parser().parse_args()

if "--device" not in sys.argv:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import fitjax as fj  # noqa: E402
from fitjax.models import CausalLMModule  # noqa: E402

import _results  # noqa: E402
from _step_timer import StepTimer  # noqa: E402


def config_for(shape: str, settings: list[str]) -> dict:
    config = dict(SHAPES[shape])
    for setting in settings:
        key, sep, value = setting.partition("=")
        if not sep or not key:
            raise SystemExit(f"lm_shapes.py: --set {setting!r} is not KEY=VALUE, e.g. --set num_hidden_layers=4")
        try:
            config[key] = json.loads(value)
        except json.JSONDecodeError:
            config[key] = value
    return config


def flops_per_token(module: CausalLMModule, params, length: int) -> tuple[int, int, int]:
    """(model FLOPs a trained token costs, matmul parameters N, trainable parameters where some
    are frozen (LoRA's adapters), else 0)."""
    c = module.model.config
    attn = c.num_heads * c.head_dim
    per_layer = c.hidden_size * (attn + 2 * c.num_kv_heads * c.head_dim) + attn * c.hidden_size \
        + 3 * c.hidden_size * c.intermediate_size
    n = c.num_layers * per_layer + c.vocab_size * c.hidden_size  # the output layer (tied or not)
    attention = 12 * c.num_layers * attn * length
    mask = module.trainable_mask(params)
    if mask is None:
        return 6 * n + attention, n, 0
    trainable = sum(x.size for x, on in zip(jax.tree.leaves(params), jax.tree.leaves(mask)) if on)
    return 4 * n + 6 * trainable + attention, n, trainable


def run(args) -> dict:
    config = config_for(args.shape, args.set)
    module = CausalLMModule(config, lr=1e-4, scan_layers=args.scan_layers, attention=args.attention)
    if args.lora:
        module.apply_lora(LORA_TARGETS, rank=args.lora)
    rows = args.batch * (args.warmup + args.steps + 1)
    tokens = np.random.default_rng(0).integers(0, config["vocab_size"], (rows, args.length + 1), dtype=np.int32)
    timer = StepTimer(args.warmup, args.steps)
    trainer = fj.Trainer(max_steps=args.warmup + args.steps, precision="bf16-mixed", callbacks=[timer],
                         enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                         logger=False, devices=1, remat=args.remat)
    started = time.perf_counter()
    trainer.fit(module, fj.DataLoader({"tokens": tokens}, batch_size=args.batch, drop_last=True))
    fit_seconds = time.perf_counter() - started
    flops, n, trainable = flops_per_token(module, trainer.state.params, args.length)
    device = jax.devices()[0]
    spec = fj.planner.spec_for(device.device_kind)
    peak = args.peak_tflops * 1e12 if args.peak_tflops else (spec.peak_flops if spec is not None else None)
    tokens_per_second = args.steps * args.batch * args.length / timer.seconds
    stats = device.memory_stats() or {}
    figures = {"shape": args.shape, "config": config, "batch": args.batch, "length": args.length,
               "lora_rank": args.lora, "scan_layers": args.scan_layers, "attention": args.attention,
               "remat": args.remat, "matmul_params": n, "lora_params": trainable,
               "flops_per_token": flops, "tokens_per_second": tokens_per_second,
               "step_seconds": timer.seconds / args.steps, "fit_seconds": fit_seconds,
               "mfu": tokens_per_second * flops / peak if peak else None, "peak_flops": peak,
               "peak_bytes_in_use": stats.get("peak_bytes_in_use"), "bytes_limit": stats.get("bytes_limit"),
               "train_loss": float(trainer.callback_metrics["train/loss"])}
    del trainer  # its state stays on the chip until dropped
    return figures


def main(argv=None) -> None:
    args = _parser().parse_args(argv)
    if args.smoke:
        args.shape, args.batch, args.length, args.warmup, args.steps = "smoke", 2, 128, 1, 1
    figures = run(args)
    mfu = f", MFU {figures['mfu']:.1%}" if figures["mfu"] else ""
    memory = figures["peak_bytes_in_use"]
    options = "".join(f", {o}" for o in (f"LoRA {args.lora}" if args.lora else "",
                                         "scan" if args.scan_layers else "",
                                         f"remat {args.remat}" if args.remat != "none" else "") if o)
    print(f"{args.shape}{options}, {args.batch} x {args.length}: "
          f"{figures['tokens_per_second']:,.0f} tokens/s, {figures['step_seconds'] * 1e3:.1f} ms a step{mfu}"
          + (f", peak {memory / 2**30:.2f} GiB" if memory else ""), flush=True)
    _results.record(args.json, figures)


if __name__ == "__main__":
    main()
