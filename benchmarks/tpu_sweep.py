"""A hand-written GPT train step under each choice that decides a TPU's MFU, timed side by side.

    python benchmarks/tpu_sweep.py --smoke                       # CPU, seconds: checks it runs
    python benchmarks/tpu_sweep.py --config small:attn=splash,batch=16,loss=chunked --out sweep.json

The profile-first half of the TPU work: before fitjax's pieces were changed, this script measured
what each choice is worth on the chip with nothing of fitjax in the step: attention through XLA
(`jax.nn.dot_product_attention`, scores materialised), through the Pallas TPU kernels (splash,
flash) or through `fj.nn.attention`; the output layer and loss as one float32 [batch, length,
vocab] array or chunked over the length; rematerialisation per block; blocks unrolled or scanned;
the batch. Each configuration: bf16 compute with float32 master weights, AdamW, the state donated.
Every program is compiled first (in threads: XLA compiles on the host's cores), then each is timed
for `--steps` after two warm-up steps. MFU counts model FLOPs (6N + attention, PaLM's count) over
the chip's peak (`--peak-tflops`, 197 for a v5e chip). Results are written as JSON as they come,
so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import os
import sys
import time
import traceback


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", action="append", default=[], help="shape:key=value,... (see Config)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--peak-tflops", type=float, default=None)
    parser.add_argument("--out", default=None, help="JSON file written after each configuration")
    parser.add_argument("--trace", action="append", default=[],
                        help="profile 3 steps of the configurations whose name contains this, into --trace-dir")
    parser.add_argument("--trace-dir", default="traces")
    parser.add_argument("--compile-threads", type=int, default=4)
    parser.add_argument("--smoke", action="store_true")
    return parser


if __name__ == "__main__":  # --help (or a wrong argument) answered before JAX is imported
    _parser().parse_args()


import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import _results  # noqa: E402

SHAPES = {
    "tiny": dict(layers=2, width=128, heads=2, context=128, vocab=512),
    "smoke": dict(layers=1, width=128, heads=2, context=128, vocab=256),  # --smoke's: each choice's code path
    "small": dict(layers=12, width=768, heads=12, context=1024, vocab=50304),   # GPT-2 small, 124 M
    "medium": dict(layers=24, width=1024, heads=16, context=1024, vocab=50304),  # GPT-2 medium, 355 M
}


@dataclasses.dataclass(frozen=True)
class Config:
    shape: str
    attn: str = "xla"        # xla | splash | flash | fj
    batch: int = 8
    loss: str = "plain"      # plain | chunked
    remat: str = "none"      # none | full | dots
    scan: int = 0
    chunk: int = 256         # rows of the length per chunk of the chunked loss

    @property
    def name(self) -> str:
        return f"{self.shape}:attn={self.attn},batch={self.batch},loss={self.loss},remat={self.remat},scan={self.scan}"

    @classmethod
    def parse(cls, text: str) -> "Config":
        shape, _, rest = text.partition(":")
        fields = dict(item.split("=") for item in rest.split(",") if item)
        return cls(shape=shape, **{k: (int(v) if k in ("batch", "scan", "chunk") else v) for k, v in fields.items()})


# ----------------------------------------------------------------------------------------- attention

def _splash(q, k, v, *, kind: str, interpret: bool):
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    batch, length, heads, dim = q.shape
    q, k, v = (x.transpose(0, 2, 1, 3) for x in (q, k, v))  # [batch, heads, length, dim]
    q = q * dim ** -0.5
    if kind == "flash":
        from jax.experimental.pallas.ops.tpu import flash_attention as fa
        out = fa.flash_attention(q, k, v, causal=True, sm_scale=1.0)
    else:
        mask = sm.MultiHeadMask([sm.CausalMask((length, length)) for _ in range(heads)])
        block = min(512, length)
        sizes = sk.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
                              block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block)
        kernel = sk.make_splash_mha_single_device(mask, block_sizes=sizes, interpret=interpret)
        out = jax.vmap(kernel)(q, k, v)
    return out.transpose(0, 2, 1, 3)


def attend(q, k, v, kind: str, interpret: bool):
    if kind == "xla":
        return jax.nn.dot_product_attention(q, k, v, is_causal=True)
    if kind == "fj":
        import fitjax as fj
        return fj.nn.attention(q, k, v, causal=True)
    return _splash(q, k, v, kind=kind, interpret=interpret)


# --------------------------------------------------------------------------------------------- model

class Block(nn.Module):
    heads: int
    attn: str
    interpret: bool

    @nn.compact
    def __call__(self, x, _=None):
        batch, length, width = x.shape
        dim = width // self.heads
        h = nn.LayerNorm(use_bias=False, dtype=jnp.bfloat16)(x)
        qkv = nn.Dense(3 * width, use_bias=False, dtype=jnp.bfloat16, name="qkv")(h)
        q, k, v = (t.reshape(batch, length, self.heads, dim) for t in jnp.split(qkv, 3, axis=-1))
        a = attend(q, k, v, self.attn, self.interpret).reshape(batch, length, width)
        x = x + nn.Dense(width, use_bias=False, dtype=jnp.bfloat16, name="proj")(a)
        h = nn.LayerNorm(use_bias=False, dtype=jnp.bfloat16)(x)
        h = nn.Dense(4 * width, use_bias=False, dtype=jnp.bfloat16, name="up")(h)
        x = x + nn.Dense(width, use_bias=False, dtype=jnp.bfloat16, name="down")(nn.gelu(h))
        return x, None


class GPT(nn.Module):
    layers: int
    width: int
    heads: int
    context: int
    vocab: int
    attn: str
    remat: str
    scan: bool
    interpret: bool

    @nn.compact
    def __call__(self, tokens):
        embed = nn.Embed(self.vocab, self.width, dtype=jnp.bfloat16, name="embed")
        pos = self.param("positions", nn.initializers.normal(0.01), (self.context, self.width))
        x = (embed(tokens) + pos[: tokens.shape[1]]).astype(jnp.bfloat16)
        block = Block
        if self.remat != "none":
            policy = {"full": None, "dots": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims}[self.remat]
            block = nn.remat(Block, policy=policy, prevent_cse=not self.scan)
        if self.scan:
            x, _ = nn.scan(block, variable_axes={"params": 0}, split_rngs={"params": True}, length=self.layers)(
                self.heads, self.attn, self.interpret, name="blocks")(x, None)
        else:
            for i in range(self.layers):
                x, _ = block(self.heads, self.attn, self.interpret, name=f"block_{i}")(x)
        return nn.LayerNorm(use_bias=False, dtype=jnp.bfloat16)(x), embed.embedding


def plain_loss(hidden, table, targets):
    logits = (hidden @ table.astype(jnp.bfloat16).T).astype(jnp.float32)
    return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()


def chunked_loss(hidden, table, targets, chunk: int):
    batch, length, width = hidden.shape
    n = length // chunk
    h = hidden.reshape(batch, n, chunk, width).swapaxes(0, 1)
    t = targets.reshape(batch, n, chunk).swapaxes(0, 1)
    table = table.astype(jnp.bfloat16)

    @jax.checkpoint
    def one(total, xs):
        hc, tc = xs
        logits = (hc @ table.T).astype(jnp.float32)
        return total + optax.softmax_cross_entropy_with_integer_labels(logits, tc).sum(), None

    total, _ = jax.lax.scan(one, jnp.zeros((), jnp.float32), (h, t))
    return total / (batch * length)


def flops_per_token(layers, width, context, vocab, **_):
    return 6 * (12 * layers * width * width + vocab * width) + 12 * layers * context * width


# ------------------------------------------------------------------------------------------- runner

def build(cfg: Config, interpret: bool):
    shape = SHAPES[cfg.shape]
    model = GPT(**shape, attn=cfg.attn, remat=cfg.remat, scan=bool(cfg.scan), interpret=interpret)
    tx = optax.adamw(1e-4, b1=0.9, b2=0.95, weight_decay=0.1)
    tokens = jnp.zeros((cfg.batch, shape["context"] + 1), jnp.int32)

    def loss_fn(params, tokens):
        hidden, table = model.apply({"params": jax.tree.map(lambda p: p.astype(jnp.bfloat16), params)},
                                    tokens[:, :-1])
        if cfg.loss == "chunked":
            return chunked_loss(hidden, table, tokens[:, 1:], cfg.chunk)
        return plain_loss(hidden, table, tokens[:, 1:])

    def step(params, opt_state, tokens):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    init = jax.jit(lambda key: (lambda p: (p, tx.init(p)))(model.init(key, tokens[:, :-1])["params"]))
    # compiled from shapes alone: several programs compile at once without holding their states
    params, opt_state = jax.eval_shape(init, jax.random.key(0))
    jitted = jax.jit(step, donate_argnums=(0, 1))
    started = time.perf_counter()
    compiled = jitted.lower(params, opt_state, tokens).compile()
    return compiled, init, time.perf_counter() - started


def run(cfg: Config, compiled, init, *, steps: int, peak: float | None, trace: str | None):
    shape = SHAPES[cfg.shape]
    params, opt_state = init(jax.random.key(0))
    rng = np.random.default_rng(0)
    batches = [jnp.asarray(rng.integers(0, shape["vocab"], (cfg.batch, shape["context"] + 1), np.int32))
               for _ in range(4)]
    for i in range(2):
        params, opt_state, loss = compiled(params, opt_state, batches[i % 4])
    jax.block_until_ready(loss)
    started = time.perf_counter()
    for i in range(steps):
        params, opt_state, loss = compiled(params, opt_state, batches[i % 4])
    jax.block_until_ready(loss)
    seconds = (time.perf_counter() - started) / steps
    if trace:
        with jax.profiler.trace(trace):
            for i in range(3):
                params, opt_state, loss = compiled(params, opt_state, batches[i % 4])
            jax.block_until_ready(loss)
    tokens = cfg.batch * shape["context"]
    model_flops = flops_per_token(**shape) * tokens
    memory = compiled.memory_analysis()
    row = {"config": cfg.name, "step_s": seconds, "tokens_per_s": tokens / seconds,
           "model_tflops_per_s": model_flops / seconds / 1e12, "loss": float(loss),
           "temp_bytes": getattr(memory, "temp_size_in_bytes", None),
           "argument_bytes": getattr(memory, "argument_size_in_bytes", None)}
    if peak:
        row["mfu"] = model_flops / seconds / (peak * 1e12)
    stats = jax.devices()[0].memory_stats() or {}
    row["peak_bytes_in_use"] = stats.get("peak_bytes_in_use")
    return row


def main(argv=None) -> None:
    args = _parser().parse_args(argv)
    interpret = jax.devices()[0].platform != "tpu"
    if args.smoke:
        args.config = ["smoke:attn=xla,batch=2", "smoke:attn=splash,batch=2,loss=chunked,chunk=64",
                       "smoke:attn=fj,batch=2,remat=dots,scan=1"]
        args.steps = 1
    configs = [Config.parse(text) for text in args.config]
    result = {"peak_tflops": args.peak_tflops, "steps": args.steps, "rows": []}

    def save():  # the command, commit, versions and device beside the rows (`_results`)
        _results.record(args.out, result)

    def compile_one(cfg):
        try:
            return build(cfg, interpret)
        except Exception as error:  # noqa: BLE001 (a configuration that does not build is a result)
            return error

    with concurrent.futures.ThreadPoolExecutor(args.compile_threads) as pool:
        futures = [pool.submit(compile_one, cfg) for cfg in configs]
        for cfg, future in zip(configs, futures):
            built = future.result()
            if isinstance(built, Exception):
                row = {"config": cfg.name, "error": f"{type(built).__name__}: {str(built)[:400]}"}
            else:
                compiled, init, compile_s = built
                try:
                    traced = any(part in cfg.name for part in args.trace)
                    trace = os.path.join(args.trace_dir, f"config{len(result['rows'])}") if traced else None
                    row = run(cfg, compiled, init, steps=args.steps, peak=args.peak_tflops, trace=trace)
                    row["compile_s"] = compile_s
                except Exception as error:  # noqa: BLE001
                    row = {"config": cfg.name, "error": f"{type(error).__name__}: {str(error)[:400]}",
                           "where": traceback.format_exc()[-600:]}
                del built, compiled, init
            result["rows"].append(row)
            print(json.dumps(row), flush=True)
            save()


if __name__ == "__main__":
    main()
