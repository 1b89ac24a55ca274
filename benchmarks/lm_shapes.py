"""Language models people fine-tune, at their real shapes, trained by `fitjax.models` on one device.

    python benchmarks/lm_shapes.py --device --shape qwen2.5-0.5b                 # full fine-tune, bf16-mixed
    python benchmarks/lm_shapes.py --device --shape llama-3.2-1b --lora 16       # LoRA rank 16 on every projection
    python benchmarks/lm_shapes.py --device --shape qwen2.5-0.5b --scan-layers --remat dots
    python benchmarks/lm_shapes.py --device --shape llama-3.2-1b --precision bf16-true --moments int8
    python benchmarks/lm_shapes.py --device --shape llama-3.1-8b --batch 4 --lora 16 --quantize int8 \
        --scan-layers --remat full                                               # QLoRA, an 8-bit base
    python benchmarks/lm_shapes.py --plan tpu-v5e-1 --shape llama-3.1-8b ...     # planned deviceless, nothing runs
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

`--scan-layers`, `--attention`, `--loss-chunk` and `--moments` are `CausalLMModule`'s options of those names,
`--remat` and `--precision` the Trainer's (bf16-true: bfloat16 weights, gradients and moments, as
torchtune's full fine-tunes); `--moments` stores AdamW's moments as `fj.optim.adamw(moments=...)`
does (int8: 8-bit block-wise); `--set key=value` adds or replaces a key of the architecture's
config dict; `--lora RANK` applies LoRA to every attention and MLP projection, `--quantize` holds
their base weights in int8, int4 or nf4 (QLoRA, qwix). `--json` writes the figures with the
command, commit and machine.

`--remat none,full` fits with the first policy whose step the planner fits on this device
(`Trainer.plan`, 5% of the memory kept free), `--longest L1,L2,...` at the longest length it fits
(a binary search): each planned peak is in the JSON.

`--plan TARGET` runs nothing: it compiles the train step (`Trainer.plan`) and the program that
makes the state of random weights (`fitjax.step.jitted.abstract_init`) for TARGET, `tpu-v5e-1`
deviceless with libtpu, and prints XLA's peak of each (a QLoRA init that held the float model
would show there), the state's parts and the planner's step estimate.
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
    # seconds on a CPU: the same code path, nothing measured (2 layers: update_in_backward's check
    # that one layer's optimizer state is a slice of the whole model's needs two)
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
    parser.add_argument("--quantize", choices=("int8", "int4", "nf4"), default=None,
                        help="QLoRA (with --lora): the adapted base weights held in this type (qwix)")
    parser.add_argument("--moments", choices=("float32", "bfloat16", "int8"), default="float32",
                        help="AdamW's moments as fj.optim.adamw(moments=...) stores them (default float32)")
    parser.add_argument("--precision", default="bf16-mixed",
                        help="Trainer(precision=...): bf16-mixed (float32 weights) or bf16-true (bfloat16 weights)")
    parser.add_argument("--loss-chunk", type=int, default=256, help="positions per chunk of the loss")
    parser.add_argument("--scan-layers", action="store_true", help="the layers as one nn.scan")
    parser.add_argument("--attention", default="auto", help="fj.nn.attention's implementation (default auto)")
    parser.add_argument("--remat", default="none",
                        help="Trainer(remat=...): none, full, dots or offload; a list (none,full): the first "
                             "whose step the planner fits on this device (5%% kept free)")
    parser.add_argument("--update-in-backward", action="store_true",
                        help="Trainer(update_in_backward=True): each layer's optimizer update inside the backward "
                             "pass, no whole-model gradient held (needs --scan-layers)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config.json key (JSON value: true, 4, \"x\"), e.g. num_hidden_layers=4")
    parser.add_argument("--warmup", type=int, default=3, help="untimed optimizer steps first (compilation)")
    parser.add_argument("--steps", type=int, default=10, help="timed optimizer steps")
    parser.add_argument("--peak-tflops", type=float, default=None, help="the device's peak (default: fitjax's table)")
    parser.add_argument("--json", default=None, help="write the figures here as JSON")
    parser.add_argument("--longest", default=None, metavar="L1,L2,...",
                        help="fit at the longest of these lengths whose step the planner fits on this device "
                             "(Trainer.plan, XLA's memory analysis, 5%% kept free; a binary search); --length ignored")
    parser.add_argument("--plan", default=None, metavar="TARGET",
                        help="plan instead of fitting: the train step and the state's init compiled for TARGET "
                             "(e.g. tpu-v5e-1, deviceless with libtpu) and their peak memory; nothing runs")
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


def module_for(args) -> CausalLMModule:
    if args.quantize and not args.lora:
        raise SystemExit(f"lm_shapes.py: --quantize {args.quantize} is QLoRA: give --lora RANK too")
    config = config_for(args.shape, args.set)
    module = CausalLMModule(config, lr=1e-4, scan_layers=args.scan_layers, attention=args.attention,
                            loss_chunk=args.loss_chunk, moments=args.moments)
    if args.lora:
        module.apply_lora(LORA_TARGETS, rank=args.lora, quantize=args.quantize)
    return module


def trainer_for(args, **kwargs) -> fj.Trainer:
    return fj.Trainer(precision=args.precision, enable_progress_bar=False, enable_model_summary=False,
                      enable_checkpointing=False, logger=False, devices=1, remat=args.remat,
                      update_in_backward=args.update_in_backward, **kwargs)


def plan(args) -> dict:
    """The train step and the state's init compiled for `args.plan` (nothing runs): XLA's peak
    of each, per device."""
    from fitjax.step import jitted

    module = module_for(args)
    batch = {"tokens": jax.ShapeDtypeStruct((args.batch, args.length + 1), np.int32)}
    trainer = trainer_for(args)
    started = time.perf_counter()
    step = trainer.plan(module, batch, target=args.plan)
    step_seconds = time.perf_counter() - started
    target = fj.planner.resolve_target(args.plan, jax.devices())
    strategy = fj.strategies.SingleDevice()
    strategy.setup(target.devices[:1])
    started = time.perf_counter()
    with fj.planner.quiet_stderr():
        init, init_args = jitted.abstract_init(module.step_spec(), strategy, batch, options=trainer.step_options)
        init_memory = init.lower(*init_args).compile().memory_analysis()
    init_peak = jitted.step_memory_bytes(init_memory)
    return {"target": args.plan, "step": step.as_dict(), "init_peak": init_peak,
            "init_temporaries": int(init_memory.temp_size_in_bytes), "memory_bytes": target.memory_bytes,
            "plan_seconds": step_seconds, "init_compile_seconds": time.perf_counter() - started,
            "shape": args.shape, "batch": args.batch, "length": args.length, "lora_rank": args.lora,
            "quantize": args.quantize, "moments": args.moments, "precision": args.precision, "scan_layers": args.scan_layers,
            "attention": args.attention, "remat": args.remat, "loss_chunk": args.loss_chunk,
            "update_in_backward": args.update_in_backward}


def longest(args) -> tuple[int, dict]:
    """The longest of `args.longest`'s lengths whose train step the planner fits on this device
    (a binary search: a longer step never needs less), and each planned length's peak (None:
    XLA refused it)."""
    lengths = sorted({int(x) for x in args.longest.split(",")})
    peaks, low, high, best = {}, 0, len(lengths) - 1, None
    while low <= high:
        mid = (low + high) // 2
        batch = {"tokens": jax.ShapeDtypeStruct((args.batch, lengths[mid] + 1), np.int32)}
        m = trainer_for(args).plan(module_for(args), batch, headroom=0.05).candidates[0]
        peaks[lengths[mid]] = None if m.out_of_memory else m.memory["peak"]
        print(f"planned {args.batch} x {lengths[mid]}: " + (f"peak {m.memory['peak'] / 2**30:.2f} GiB" if
              peaks[lengths[mid]] else "refused") + (", fits" if m.fits is not False else ", does not fit"), flush=True)
        if m.fits is not False:
            best, low = lengths[mid], mid + 1
        else:
            high = mid - 1
    if best is None:
        raise SystemExit(f"lm_shapes.py: no length of --longest {args.longest} fits: {peaks}")
    return best, peaks


def first_remat(args) -> tuple[str, dict]:
    """The first of `args.remat`'s policies (a comma list) whose train step the planner fits on
    this device, and each planned policy's peak (None: XLA refused it)."""
    peaks, policies = {}, args.remat.split(",")
    for policy in policies:
        args.remat = policy
        batch = {"tokens": jax.ShapeDtypeStruct((args.batch, args.length + 1), np.int32)}
        m = trainer_for(args).plan(module_for(args), batch, headroom=0.05).candidates[0]
        peaks[policy] = None if m.out_of_memory else m.memory["peak"]
        print(f"planned remat {policy}: " + (f"peak {m.memory['peak'] / 2**30:.2f} GiB" if peaks[policy] else
              "refused") + (", fits" if m.fits is not False else ", does not fit"), flush=True)
        if m.fits is not False:
            return policy, peaks
    raise SystemExit(f"lm_shapes.py: no --remat of {','.join(policies)} fits: {peaks}")


def run(args) -> dict:
    planned = {}  # what the planner said on this device before the fit: peak bytes by policy, by length
    if "," in args.remat:
        args.remat, planned["remat"] = first_remat(args)
    if args.longest:
        args.length, planned["length"] = longest(args)
    module = module_for(args)
    config = config_for(args.shape, args.set)
    rows = args.batch * (args.warmup + args.steps + 1)
    tokens = np.random.default_rng(0).integers(0, config["vocab_size"], (rows, args.length + 1), dtype=np.int32)
    timer = StepTimer(args.warmup, args.steps)
    trainer = trainer_for(args, max_steps=args.warmup + args.steps, callbacks=[timer])
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
               "lora_rank": args.lora, "quantize": args.quantize, "moments": args.moments,
               "precision": args.precision, "loss_chunk": args.loss_chunk, "scan_layers": args.scan_layers, "attention": args.attention,
               "remat": args.remat, "update_in_backward": args.update_in_backward, "matmul_params": n, "lora_params": trainable,
               "flops_per_token": flops, "tokens_per_second": tokens_per_second,
               "step_seconds": timer.seconds / args.steps, "fit_seconds": fit_seconds,
               "mfu": tokens_per_second * flops / peak if peak else None, "peak_flops": peak,
               "peak_bytes_in_use": stats.get("peak_bytes_in_use"), "bytes_limit": stats.get("bytes_limit"),
               "train_loss": float(trainer.callback_metrics["train/loss"]), "planned_peaks": planned}
    del trainer  # its state stays on the chip until dropped
    return figures


def describe(args) -> str:
    """The run's options, as the result line lists them."""
    return "".join(f", {o}" for o in (
        f"LoRA {args.lora}" if args.lora else "", f"{args.quantize} base" if args.quantize else "",
        f"{args.moments} moments" if args.moments != "float32" else "",
        args.precision if args.precision != "bf16-mixed" else "", "scan" if args.scan_layers else "",
        f"remat {args.remat}" if args.remat != "none" else "",
        "update in backward" if args.update_in_backward else "",
        f"attention {args.attention}" if args.attention != "auto" else "") if o)


def main(argv=None) -> None:
    args = _parser().parse_args(argv)
    if args.smoke:
        args.shape, args.batch, args.length, args.warmup, args.steps = "smoke", 2, 128, 1, 1
    if args.plan:
        figures = plan(args)
        m = figures["step"]["candidates"][0]
        gib = 2 ** 30
        limit = figures["memory_bytes"]
        peak = m["memory"]["peak"]
        said = f" (XLA refused it: {m['out_of_memory']})" if m["out_of_memory"] else ""
        print(f"{args.shape}{describe(args)}, {args.batch} x {args.length} on {args.plan}: step peak {peak / gib:.2f} GiB"
              f"{said} (params {m['memory']['params'] / gib:.2f}, optimizer {m['memory']['optimizer'] / gib:.2f}, "
              f"temporaries {(m['memory']['temporaries'] or 0) / gib:.2f}), free {(limit - peak) / gib:.2f} GiB "
              f"of {limit / gib:.2f}; init peak {figures['init_peak'] / gib:.2f} GiB; step estimated "
              f"{(m['step_time_s'] or 0) * 1e3:.0f} ms, MFU {(m['mfu'] or 0):.1%}; compiles "
              f"{figures['plan_seconds']:.0f} s + {figures['init_compile_seconds']:.0f} s", flush=True)
        _results.record(args.json, figures)
        return
    figures = run(args)
    mfu = f", MFU {figures['mfu']:.1%}" if figures["mfu"] else ""
    memory = figures["peak_bytes_in_use"]
    print(f"{args.shape}{describe(args)}, {args.batch} x {args.length}: "
          f"{figures['tokens_per_second']:,.0f} tokens/s, {figures['step_seconds'] * 1e3:.1f} ms a step{mfu}"
          + (f", peak {memory / 2**30:.2f} GiB" if memory else ""), flush=True)
    _results.record(args.json, figures)


if __name__ == "__main__":
    main()
