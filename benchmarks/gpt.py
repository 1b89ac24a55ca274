"""examples/gpt.py's transformer: fitjax against a hand-written jitted loop, per mesh, in one process.

    python benchmarks/gpt.py                       # CPU: 8 virtual devices, a model sized for 2 cores
    python benchmarks/gpt.py --only fsdp --repeats 3
    python benchmarks/gpt.py --device              # one TPU chip or GPU: GPT-2 small's and medium's shapes
    python benchmarks/gpt.py --device --json gpt.json --trace trace.json   # figures and idle time as JSON
    python benchmarks/gpt.py --smoke               # seconds: checks it runs (numbers mean nothing)

Both sides train the same model (examples/gpt.py's `gpt_model`: `fitjax.models.CausalLM` in GPT-2's
layout) on the same byte data with the same
recipe: bf16 mixed precision (float32 master weights, the parameters cast to bfloat16 in the
step), gradient accumulation over 2 micro-batches in a `lax.scan`, clipping at global norm 1.0
chained before AdamW with warmup-cosine, the state donated. The hand-written loop is what a JAX
user writes: `jax.jit` with the mesh's shardings (parameter shardings from Flax's logical
annotations through `nn.logical_to_mesh_sharding` and the same rules, traced under
`jax.set_mesh` and `nn.logical_axis_rules` so the model's activation constraints apply), numpy micro-batches
sliced from a shuffled array. fitjax runs `Trainer.fit` with its defaults except the progress bar,
the model summary and checkpoints (the hand-written loop prints and saves nothing).

On a device (`--device`; `--gpu` is the same) one chip runs GPT-2 small's shape (124 M parameters:
12 blocks of width 768, context 1024, GPT-2's vocabulary padded to 50304) and GPT-2 medium's (355 M:
24 blocks of width 1024), the single mesh, and for the first shape a third run: fitjax with its
defaults on (the progress bar drawn into a discarded stream, the TensorBoard logger, the default
checkpoint at each epoch's end; `--ckpt-every` adds a save every N steps), against the same
hand-written loop; `--epoch-steps N` adds a fourth: defaults on with the data cut to epochs of N
optimizer steps, so that the timed steps cross epoch ends, where `DefaultCheckpoint` saves or skips
by its budget (its saves' share of the fit is reported), and a fifth: the same epochs with
checkpointing off, so that the ratio of the two is what the checkpoint costs the step (both
timed over `--epoch-ends-steps`, long enough to hold several of the budget's saves). MFU is
model FLOPs (6N + attention) over the device kind's peak (`fitjax.planner.spec_for`). `--trace`
profiles 5 steady steps after the timed ones (none across an epoch end; the profiler slows steps
down) of the first shape's defaults-on fit and of its hand-written loop, and reports the share of
the fit's traced window the device sat idle (no program running), with each idle stretch over
1 ms: what the host loop costs a fast device.

Meshes: `single` (1 device), `dp` (8: batch split, state replicated), `fsdp` (8: state sharded),
`fsdp_tensor` (fsdp 4 × tensor 2: heads and MLP units split over `tensor`). Each is timed after a
warm-up (compilation) for `--steps` optimizer steps; runs alternate (hand-written, fitjax, ...)
`--repeats` times and the ratio is the median of per-repeat ratios (fitjax / the hand-written run
just before it). Memory: XLA's `memory_analysis()` of the hand-written step compiled for each
mesh (per device: arguments = state + micro-batches, and temporaries) and
the bytes per device of fitjax's train state, read from its arrays' shardings.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import io
import os
import shutil
import statistics
import sys
import tempfile
import time

SHAPES = {  # model and batch; micro-batch rows (global), accumulate 2 -> tokens per optimizer step
    "cpu": dict(layers=2, width=128, heads=4, context=128, batch_size=16),
    "gpt2-small": dict(layers=12, width=768, heads=12, context=1024, vocab=50304, batch_size=16),
    "gpt2-medium": dict(layers=24, width=1024, heads=16, context=1024, vocab=50304, batch_size=8),
}
# what --smoke runs under the name "cpu": every code path of the runs on a model that compiles and
# steps in a fraction of the CPU shape's time (the smoke's numbers mean nothing)
SMOKE_SHAPE = dict(layers=1, width=64, heads=2, context=64, batch_size=8)
MESHES = {  # name: (devices, data, fsdp, tensor); None: a plain data-parallel mesh
    "single": (1, None, None, None),
    "dp": (8, None, None, None),
    "fsdp": (8, 1, 8, 1),
    "fsdp_tensor": (8, 1, 4, 2),
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=sorted(MESHES), action="append")
    parser.add_argument("--steps", type=int, default=10, help="timed optimizer steps per run")
    parser.add_argument("--warmup", type=int, default=3, help="untimed optimizer steps first (compilation)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--device", "--gpu", dest="device", action="store_true",
                        help="one accelerator (TPU chip, GPU): GPT-2 small's and medium's shapes, single mesh, "
                             "and fitjax with its defaults on")
    parser.add_argument("--shape", choices=[name for name in SHAPES if name != "cpu"], action="append",
                        help="with --device: only these shapes")
    parser.add_argument("--hand-shapes", choices=[name for name in SHAPES if name != "cpu"], action="append",
                        help="with --device: the shapes that also run the hand-written loop (default: all; the "
                             "others: fitjax alone, for its MFU); the first of them also the defaults-on fit")
    parser.add_argument("--ckpt-every", type=int, default=None,
                        help="with --device: the defaults-on fit also saves every N steps")
    parser.add_argument("--no-defaults", action="store_true", help="with --device: no defaults-on fit")
    parser.add_argument("--epoch-steps", type=int, default=None,
                        help="with --device: one more defaults-on fit, its data cut to epochs of N optimizer "
                             "steps so that its timed steps cross epoch ends (the default checkpoint's schedule)")
    parser.add_argument("--epoch-ends-steps", type=int, default=None,
                        help="with --epoch-steps: the timed optimizer steps of the two epoch-end fits (default: "
                             "--steps); enough of them to hold several of the checkpoint's budgeted saves")
    parser.add_argument("--tpu-options", action="append", default=[], metavar="SPEC",
                        help="with --device: one more fitjax fit of the first shape per SPEC, compiled with "
                             "FITJAX_XLA_TPU_OPTIONS=SPEC (fitjax.step.xla_tpu), against the default fit")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="the device's peak bf16 TFLOP/s, for the MFU columns (default: the device kind's "
                             "peak in fitjax's table; none on CPU, which has no standard one)")
    parser.add_argument("--json", default=None, help="write the figures here as JSON")
    parser.add_argument("--trace", default=None, help="with --device: profile 5 steps of the first shape's "
                                                      "defaults-on fit and of its hand-written loop; the idle "
                                                      "share and each side's time per op as JSON here, the "
                                                      "traces beside it")
    parser.add_argument("--smoke", action="store_true",
                        help="the single mesh, a 1-layer model (SMOKE_SHAPE), 1 warm-up and 1 timed step, 1 repeat: "
                             "checks the script runs")
    return parser


if __name__ == "__main__":  # --help (or a wrong argument) answered before JAX is imported
    _parser().parse_args()

if "--gpu" not in sys.argv and "--device" not in sys.argv:  # 8 virtual CPU devices, before JAX is imported
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
import gpt  # noqa: E402

import fitjax as fj  # noqa: E402
import fitjax.models  # noqa: E402
from fitjax.callbacks._base import ignores_batch  # noqa: E402  (the timer never reads the batch)
from fitjax.step import xla_tpu  # noqa: E402

import _results  # noqa: E402
from _step_timer import StepTimer  # noqa: E402
from _trace import idle_share, op_times, steady_window  # noqa: E402

ACCUMULATE, CLIP = 2, 1.0


def optimizer(lr: float, total: int) -> optax.GradientTransformation:
    schedule = optax.warmup_cosine_decay_schedule(0.0, lr, 10, max(total, 11), end_value=lr / 10)
    decay = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)  # noqa: E731
    return optax.adamw(schedule, b1=0.9, b2=0.95, weight_decay=0.1, mask=decay)


# ----------------------------------------------------------------------------- hand-written loop

def hand_written_step(model: fitjax.models.CausalLM, tx: optax.GradientTransformation):
    def loss_fn(params, tokens):
        low = jax.tree.map(lambda p: p.astype(jnp.bfloat16), params)  # bf16 compute, f32 masters
        # the module's loss: the model's output layer and cross-entropy (fj.nn.chunked_cross_entropy)
        return model.apply({"params": low}, tokens[:, :-1], targets=tokens[:, 1:]).mean

    def step(params, opt_state, micro):  # micro: [accumulate, batch, context + 1]
        def one(grads, tokens):
            loss, g = jax.value_and_grad(loss_fn)(params, tokens)
            return jax.tree.map(jnp.add, grads, g), loss

        zeros = jax.tree.map(jnp.zeros_like, params)
        grads, losses = jax.lax.scan(one, zeros, micro)
        grads = jax.tree.map(lambda g: g / micro.shape[0], grads)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, losses.mean()

    return step


def hand_written(mesh_name: str, shape: dict, data: np.ndarray, *, warmup: int, steps: int,
                 trace: str | None = None):
    """Returns (tokens/s, compiled memory stats) of the hand-written loop on `mesh_name`'s mesh."""
    count, data_axis, fsdp, tensor = MESHES[mesh_name]
    devices = np.asarray(jax.devices()[:count])
    if fsdp is None:
        mesh, batch_axes, rules = Mesh(devices, ("data",)), ("data",), None
    else:
        mesh = Mesh(devices.reshape(data_axis, fsdp, tensor), ("data", "fsdp", "tensor"))
        batch_axes, rules = ("data", "fsdp"), list(gpt.GPT_RULES.items())
    model = gpt.gpt_model(**_model_shape(shape))
    tx = optax.chain(optax.clip_by_global_norm(CLIP), optimizer(1e-3, warmup + steps))
    batch = shape["batch_size"]
    example = jnp.zeros((batch, shape["context"]), jnp.int32)

    boxed = jax.eval_shape(lambda: model.init(jax.random.key(0), example))["params"]
    if rules is None:
        param_sharding = jax.tree.map(lambda _: NamedSharding(mesh, P()), nn.unbox(boxed))
    else:
        param_sharding = nn.logical_to_mesh_sharding(nn.get_partition_spec(boxed), mesh, rules)
    params = jax.jit(lambda k: nn.unbox(model.init(k, example)["params"]), out_shardings=param_sharding)(
        jax.random.key(0))
    opt_state = jax.jit(tx.init)(params)  # moments' shardings propagate from the parameters
    opt_sharding = jax.tree.map(  # counters come out on one device: replicate them on the mesh
        lambda x: x.sharding if isinstance(x.sharding, NamedSharding) and x.sharding.mesh == mesh
        else NamedSharding(mesh, P()), opt_state)
    opt_state = jax.device_put(opt_state, opt_sharding)
    micro_sharding = NamedSharding(mesh, P(None, batch_axes))
    step = jax.jit(hand_written_step(model, tx), donate_argnums=(0, 1),
                   in_shardings=(param_sharding, opt_sharding, micro_sharding),
                   out_shardings=(param_sharding, opt_sharding, NamedSharding(mesh, P())))
    # what a JAX user writes so that the model's nn.with_logical_constraint calls place activations
    # (fitjax's FSDP does the same): without it XLA gathers whole batches instead of weights
    context = contextlib.ExitStack()
    if rules is not None:
        context.enter_context(jax.set_mesh(mesh))
        context.enter_context(nn.logical_axis_rules(rules))
    with context:
        return _time_hand_written(step, params, opt_state, data, batch, shape["context"], warmup, steps, trace)


def _time_hand_written(step, params, opt_state, data, batch, context, warmup, steps, trace=None):
    per_step = ACCUMULATE * batch
    memory = step.lower(params, opt_state, np.zeros((ACCUMULATE, batch, context + 1), np.int32)
                        ).compile().memory_analysis()

    rng = np.random.default_rng(0)
    order = rng.permutation(len(data))

    def micro(i: int) -> np.ndarray:
        rows = order[(i * per_step) % (len(order) - per_step):][:per_step]
        return data[rows].reshape(ACCUMULATE, batch, -1)

    start = None
    for i in range(warmup + steps):
        if i == warmup:
            jax.block_until_ready(params)
            start = time.perf_counter()
        params, opt_state, loss = step(params, opt_state, micro(i))
    jax.block_until_ready(params)
    seconds = time.perf_counter() - start
    if trace:  # 5 more steps under the profiler, after the timed ones (tracing slows steps down)
        jax.profiler.start_trace(trace)
        for i in range(warmup + steps, warmup + steps + PROFILED):
            params, opt_state, loss = step(params, opt_state, micro(i))
        jax.block_until_ready(params)
        jax.profiler.stop_trace()
    return steps * per_step * context / seconds, memory


# ----------------------------------------------------------------------------------- fitjax

PROFILED = 5  # steps traced with --trace, after the timed ones


def _model_shape(shape: dict) -> dict:
    return {key: value for key, value in shape.items() if key != "batch_size"}


class Profile(fj.Callback):
    """A profiler trace of optimizer steps `warmup`..`warmup + steps` into `folder`."""

    def __init__(self, folder: str, warmup: int, steps: int = 5):
        self.folder, self.first, self.last, self.on = folder, warmup, warmup + steps, False

    @ignores_batch
    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step == self.first and not self.on:
            jax.block_until_ready(trainer.state)
            jax.profiler.start_trace(self.folder)
            self.on = True
        elif trainer.global_step == self.last and self.on:
            jax.block_until_ready(trainer.state)
            jax.profiler.stop_trace()
            self.on = False


def with_fitjax(mesh_name: str, shape: dict, data: np.ndarray, root: str, *, warmup: int, steps: int,
                defaults: bool = False, trace: str | None = None, ckpt_every: int | None = None,
                epoch_steps: int | None = None, checkpoint: bool = True):
    """Returns (tokens/s, params + optimizer state bytes per device, the default checkpoint's
    saves or None) of `Trainer.fit`; `defaults`: the progress bar (drawn into a discarded stream),
    the logger and (unless `checkpoint` is False) the default checkpoint on; `epoch_steps`: the data
    cut to epochs of that many optimizer steps."""
    count, data_axis, fsdp, tensor = MESHES[mesh_name]
    if fsdp is None:
        strategy = "single" if count == 1 else "dp"
    else:
        strategy = fj.strategies.FSDP(data=data_axis, fsdp=fsdp, tensor=tensor, rules=gpt.GPT_RULES)
    module = gpt.GPTModule(**_model_shape(shape), lr=1e-3, warmup=10, total_steps=max(warmup + steps, 11))
    timer = StepTimer(warmup, steps)
    if epoch_steps:
        data = data[:epoch_steps * ACCUMULATE * shape["batch_size"]]
    batches = len(data) // shape["batch_size"]  # an epoch's last group of fewer batches is a step too
    first = steady_window(warmup + steps, -(-batches // ACCUMULATE), PROFILED)
    callbacks = [timer] + ([Profile(trace, first, PROFILED)] if trace else [])
    sink = io.StringIO()
    if defaults:
        callbacks.append(fj.RichProgressBar(file=sink, force_terminal=True))
        if ckpt_every:
            callbacks.append(fj.ModelCheckpoint(every_n_train_steps=ckpt_every))
    if defaults:
        off = {} if checkpoint else dict(enable_checkpointing=False)
    else:
        off = dict(enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False, logger=False)
    profiled = first - warmup - steps + PROFILED + 1 if trace else 0  # traced after the timed steps
    trainer = fj.Trainer(max_steps=warmup + steps + profiled, strategy=strategy, devices=count, precision="bf16-mixed",
                         accumulate_grad_batches=ACCUMULATE, gradient_clip_val=CLIP, callbacks=callbacks,
                         default_root_dir=root, **off)
    loader = fj.DataLoader({"tokens": data}, batch_size=shape["batch_size"], shuffle=True, drop_last=True)
    with contextlib.redirect_stdout(sink):
        trainer.fit(module, loader)
    held = fj.strategies.bytes_per_device((trainer.state.params, trainer.state.opt_state))
    saved = trainer.checkpoint_callback if isinstance(trainer.checkpoint_callback, fj.callbacks.DefaultCheckpoint) \
        else None
    saves = None if saved is None else {  # the whole fit's, the save after the last step included
        "seconds": saved.save_seconds, "write_wait_seconds": saved.write_wait_seconds,
        "write_cpu_seconds": saved.write_cpu_seconds, "transfer_seconds": saved.transfer_seconds,
        "skipped": saved.skipped_saves, "epochs": trainer.current_epoch, "fit_seconds": timer.fit_seconds}
    return timer.steps * ACCUMULATE * shape["batch_size"] * shape["context"] / timer.seconds, held, saves


def main(argv=None) -> None:
    args = _parser().parse_args(argv)
    spec = fj.planner.spec_for(jax.devices()[0].device_kind)
    peak = args.peak_tflops or (spec.peak_flops / 1e12 if spec is not None else None)
    if args.smoke:
        args.only, args.warmup, args.steps, args.repeats = ["single"], 1, 1, 1
        args.epoch_ends_steps = None
    crossed = args.epoch_ends_steps or args.steps  # the epoch-end fits' timed steps
    if args.device:  # with --smoke: the device runs' code paths on the CPU-sized model
        shapes = ["cpu"] if args.smoke else args.shape or ["gpt2-small", "gpt2-medium"]
        names = ["single"]
    else:
        shapes, names = ["cpu"], args.only or list(MESHES)
    print(f"jax {jax.__version__} on {jax.devices()[0].device_kind} ({jax.device_count()} devices); bf16-mixed, "
          f"accumulate {ACCUMULATE}, clip {CLIP}; {args.steps} timed steps after {args.warmup}")
    header = (f"{'shape':<12} {'mesh':<12} {'hand tok/s':>11} {'fitjax tok/s':>13} {'ratio':>6} {'fitjax GFLOP/s':>15} "
              f"{'step args MiB':>14} {'step temp MiB':>14} {'fitjax state MiB':>17}"
              + (f" {'hand MFU':>8} {'fitjax MFU':>10}" if peak else ""))
    print(header)
    mib = 2**20
    rows = []

    def save(idle=None) -> None:  # after every row, so a run cut short keeps what it measured
        _results.record(args.json, {"accumulate": ACCUMULATE, "clip": CLIP, "steps": args.steps,
                                    "warmup": args.warmup, "rows": rows, "idle": idle})
    with tempfile.TemporaryDirectory() as root:
        for shape_name in shapes:
            shape = SMOKE_SHAPE if args.smoke else SHAPES[shape_name]
            train, _ = gpt.splits(shape["context"])
            data = train["tokens"]
            flops = gpt.flops_per_token(**shape)
            for name in names:
                hand, fit, full, crossing, unsaved, saves = [], [], [], [], [], None
                compared = not args.device or args.smoke or not args.hand_shapes or shape_name in args.hand_shapes
                for _ in range(args.repeats):  # alternate, so drifts in machine load hit both
                    if compared:
                        hand_trace = os.path.join(root, "trace-hand") if args.trace and not rows else None
                        speed, memory = hand_written(name, shape, data, warmup=args.warmup, steps=args.steps,
                                                     trace=hand_trace)
                        hand.append(speed)
                    speed, held, _ = with_fitjax(name, shape, data, root, warmup=args.warmup, steps=args.steps)
                    fit.append(speed)
                    if args.device and compared and shape_name == shapes[0] and not args.no_defaults:
                        trace = os.path.join(root, "trace") if args.trace and not rows else None
                        full.append(with_fitjax(name, shape, data, root, warmup=args.warmup, steps=args.steps,
                                                defaults=True, trace=trace, ckpt_every=args.ckpt_every)[0])
                        if args.epoch_steps:  # the same across epoch ends: the default checkpoint's saves
                            speed, _, saves = with_fitjax(name, shape, data, root, warmup=args.warmup,
                                                          steps=crossed, defaults=True,
                                                          epoch_steps=args.epoch_steps)
                            crossing.append(speed)
                            unsaved.append(with_fitjax(name, shape, data, root, warmup=args.warmup,
                                                       steps=crossed, defaults=True, epoch_steps=args.epoch_steps,
                                                       checkpoint=False)[0])
                row = {"shape": shape_name, "model": shape, "mesh": name, "flops_per_token": flops,
                       "hand_tokens_per_s": hand, "fitjax_tokens_per_s": fit, "fitjax_state_bytes": held}
                if not hand:  # fitjax alone: its MFU
                    rows.append({**row, **({"peak_tflops": peak, "fitjax_mfu": max(fit) * flops / (peak * 1e12)}
                                           if peak else {})})
                    save()
                    print(f"{shape_name:<12} {name:<12} {'-':>11} {max(fit):>13.0f} {'-':>6} "
                          f"{max(fit) * flops / 1e9:>15.2f}" + (f" {'-':>8} {rows[-1]['fitjax_mfu']:>10.1%}"
                                                                if peak else ""), flush=True)
                    continue
                row.update(ratio=statistics.median(f / h for f, h in zip(fit, hand)),
                           step_argument_bytes=memory.argument_size_in_bytes, step_temp_bytes=memory.temp_size_in_bytes)
                if full:
                    row.update(fitjax_defaults_tokens_per_s=full,
                               defaults_ratio=statistics.median(f / h for f, h in zip(full, hand)))
                if crossing:
                    saves["share"] = saves["seconds"] / saves["fit_seconds"]
                    row.update(epoch_ends_tokens_per_s=crossing, epoch_steps=args.epoch_steps, epoch_ends_steps=crossed,
                               epoch_ends_ratio=statistics.median(f / h for f, h in zip(crossing, hand)),
                               default_checkpoint=saves, epoch_ends_no_checkpoint_tokens_per_s=unsaved,
                               checkpoint_ratio=statistics.median(f / u for f, u in zip(crossing, unsaved)))
                if peak:
                    row.update(peak_tflops=peak, hand_mfu=max(hand) * flops / (peak * 1e12 * MESHES[name][0]),
                               fitjax_mfu=max(fit) * flops / (peak * 1e12 * MESHES[name][0]))
                rows.append(row)
                save()
                print(f"{shape_name:<12} {name:<12} {max(hand):>11.0f} {max(fit):>13.0f} {row['ratio']:>5.2f}x "
                      f"{max(fit) * flops / 1e9:>15.2f} {memory.argument_size_in_bytes / mib:>14.2f} "
                      f"{memory.temp_size_in_bytes / mib:>14.2f} {held / mib:>17.2f}"
                      + (_mfu(max(hand), max(fit), flops, peak, MESHES[name][0]) if peak else ""), flush=True)
                if full:
                    print(f"{'':<12} {'defaults on':<12} {'':>11} {max(full):>13.0f} {row['defaults_ratio']:>5.2f}x",
                          flush=True)
                if crossing:
                    print(f"{'':<12} {'epoch ends':<12} {'':>11} {max(crossing):>13.0f} {row['epoch_ends_ratio']:>5.2f}x"
                          f"  (defaults on, {crossed} steps in {args.epoch_steps}-step epochs: the default "
                          f"checkpoint's saves took {saves['seconds']:.2f} s of the {saves['fit_seconds']:.1f} s "
                          f"fit ({saves['share']:.1%}), "
                          f"{saves['write_wait_seconds']:.2f} s of it waiting for writes, and the writes beside "
                          f"the loop {saves['write_cpu_seconds']:.2f} s of CPU and their copies' transfers to "
                          f"the host {saves['transfer_seconds']:.2f} s; {saves['skipped']} "
                          f"epoch ends skipped)", flush=True)
                    print(f"{'':<12} {'no ckpt':<12} {'':>11} {max(unsaved):>13.0f} "
                          f"{statistics.median(u / h for u, h in zip(unsaved, hand)):>5.2f}x  (the same epochs, "
                          f"checkpointing off: the checkpoint costs the step {1 - row['checkpoint_ratio']:.1%})",
                          flush=True)
            if args.device and shape_name == shapes[0]:
                for spec in args.tpu_options:  # a compiler option measured: the same fit compiled with it
                    rows.append(_with_options(spec, shape_name, shape, data, root, args, fit, flops, peak))
                    save()
        idle = idle_share(os.path.join(root, "trace")) if args.device and args.trace else None
        if idle is not None:  # where each program spends the device's time, op by op, side by side
            idle["ops"] = {"fitjax": op_times(os.path.join(root, "trace")),
                           "hand": op_times(os.path.join(root, "trace-hand"))}
            raw = os.path.splitext(args.trace)[0] + "-raw"
            for side in ("trace", "trace-hand"):  # the traces themselves, for a profiler's viewer
                for found in glob.glob(os.path.join(root, side, "**", "*.xplane.pb"), recursive=True):
                    os.makedirs(os.path.join(raw, side), exist_ok=True)
                    shutil.copy(found, os.path.join(raw, side))
    if idle is not None:
        print(f"device idle in {idle['window_s'] * 1e3:.1f} ms of steady fitjax steps (defaults on): "
              f"{idle['idle_share']:.2%} ({idle['programs']} programs ran; idle stretches over 1 ms, "
              f"[start, length] in ms: {idle['gaps_ms']})", flush=True)
        with open(args.trace, "w") as file:
            json.dump(idle, file, indent=1)
    save(idle)


def _with_options(spec: str, shape_name: str, shape: dict, data: np.ndarray, root: str, args, default: list,
                  flops: int, peak: float | None) -> dict:
    """One fitjax fit of the single mesh compiled with `FITJAX_XLA_TPU_OPTIONS=spec`, against the
    default fits just measured (`default`, tokens/s)."""
    saved = os.environ.get(xla_tpu.OPTIONS_ENV)
    os.environ[xla_tpu.OPTIONS_ENV] = spec  # read when each program is built
    try:
        speed, _, _ = with_fitjax("single", shape, data, root, warmup=args.warmup, steps=args.steps)
    finally:
        if saved is None:
            os.environ.pop(xla_tpu.OPTIONS_ENV)
        else:
            os.environ[xla_tpu.OPTIONS_ENV] = saved
    row = {"shape": shape_name, "mesh": "single", "tpu_options": spec, "fitjax_tokens_per_s": [speed],
           "ratio_to_default": speed / max(default), "flops_per_token": flops}
    if peak:
        row["fitjax_mfu"] = speed * flops / (peak * 1e12)
    print(f"{shape_name:<12} {'options':<12} {'':>11} {speed:>13.0f} {row['ratio_to_default']:>5.2f}x  "
          f"(FITJAX_XLA_TPU_OPTIONS={spec!r} against the default fit)", flush=True)
    return row


def _mfu(hand: float, fit: float, flops: int, peak_tflops: float, devices: int) -> str:
    """Model FLOP utilisation: the model's training FLOP/s over the peak of the mesh's devices."""
    return "".join(f" {tokens * flops / (peak_tflops * 1e12 * devices):>{w}.1%}"
                   for tokens, w in ((hand, 8), (fit, 10)))


if __name__ == "__main__":
    main()
