"""Generation speed: tokens/s of `Trainer.generate` with the KV cache against without it.

    python benchmarks/generation.py            # the GPT example, width 256, 4 layers; 256 new tokens
    python benchmarks/generation.py --smoke    # seconds: checks it runs (numbers mean nothing)

The model is examples/gpt.py's (`fitjax.models.CausalLM` in GPT-2's layout; random weights: speed does not depend on them), batch 4 of
prompts of 5 to 12 bytes, greedy, no end-of-sequence token (every row generates all tokens).
"With cache" is `Trainer.generate`'s default: a prefill, then each new token one forward pass
of one token over the cached keys and values. "Without" is `use_cache=False`: each new token
re-runs the model over the whole padded sequence (prompt bucket + new tokens). Both are one
compiled program each; the time is the median of `--repeats` calls after a first (compiling)
one (without the cache: one call). The issue's bar: at least 5x at 256 new tokens on CPU.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="a tiny model and 16 tokens: seconds")
    parser.add_argument("--new", type=int, default=256, help="tokens generated per prompt")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", action="store_true", help="(the default) run where JAX finds a device")
    parser.add_argument("--json", default=None, help="write the figures here as JSON")
    return parser


if __name__ == "__main__":  # --help (or a wrong argument) answered before JAX is imported
    _parser().parse_args()


import jax

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
import _results  # noqa: E402
import fitjax as fj  # noqa: E402
import gpt  # noqa: E402

PROMPTS = ["The ", "def main(", "If the value", "class A"]


def tokens_per_second(trainer: fj.Trainer, module: gpt.GPTModule, prompts: list, new: int, *, use_cache: bool,
                      repeats: int) -> tuple[float, list]:
    def once() -> tuple[float, list]:
        start = time.perf_counter()
        out = trainer.generate(module, prompts, max_new_tokens=new, temperature=0, use_cache=use_cache)
        return time.perf_counter() - start, out  # generate returns host values: the device is done

    _, out = once()  # compiles
    seconds = statistics.median(once()[0] for _ in range(repeats))
    return len(prompts) * new / seconds, out


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    if args.smoke:
        args.new, args.layers, args.width, args.repeats = 16, 1, 32, 1
    context = 16 + args.new  # the longest prompt's bucket, then the new tokens
    module = gpt.GPTModule(layers=args.layers, width=args.width, heads=4, context=context)
    trainer = fj.Trainer(strategy="single", devices=1, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False)
    prompts = [gpt.encode(p).tolist() for p in PROMPTS]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*never fitted nor loaded")  # random weights on purpose
        cached, with_cache = tokens_per_second(trainer, module, prompts, args.new, use_cache=True,
                                               repeats=args.repeats)
        plain, without = tokens_per_second(trainer, module, prompts, args.new, use_cache=False,
                                           repeats=1)  # minutes a call on CPU, and steady
    same = "same tokens" if with_cache == without else "TOKENS DIFFER"
    print(f"generation on {jax.devices()[0].platform}: GPT {args.layers} layers x width {args.width}, batch "
          f"{len(prompts)}, {args.new} new tokens, greedy ({same})")
    print(f"{'':14}{'tokens/s':>10}")
    print(f"{'with cache':14}{cached:>10.0f}")
    print(f"{'without':14}{plain:>10.0f}")
    print(f"ratio {cached / plain:.1f}x")
    _results.record(args.json, {"layers": args.layers, "width": args.width, "batch": len(prompts), "new_tokens": args.new,
                                "cached_tokens_per_s": cached, "plain_tokens_per_s": plain, "ratio": cached / plain,
                                "same_tokens": with_cache == without})


if __name__ == "__main__":
    main()
