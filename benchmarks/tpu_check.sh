#!/usr/bin/env bash
# The TPU check: what the docs' TPU figures quote, measured on one TPU chip, in parts that each
# fit one 10-minute command (run them one after the other on a warm machine).
#
#   bash benchmarks/tpu_check.sh --part 1     # GPT-2 small: fitjax against the hand-written loop, MFU,
#                                             # defaults on across epoch ends, the device's idle time
#                                             # and both sides' op times in traces
#   bash benchmarks/tpu_check.sh --part 2     # the accelerator tests, the loop's small workloads
#   bash benchmarks/tpu_check.sh --part 3     # the planner against fits, and a plan that does not fit
#   bash benchmarks/tpu_check.sh --part 4     # the profile-first sweep and generation
#   bash benchmarks/tpu_check.sh --part 5     # GPT-2 medium: fitjax against the hand-written loop, MFU
#   bash benchmarks/tpu_check.sh --part 6     # where a checkpoint's cost goes: the step beside a save
#   bash benchmarks/tpu_check.sh --part 7     # fitjax.models at real shapes: Qwen2.5-0.5B, Llama-3.2-1B LoRA
#   bash benchmarks/tpu_check.sh --part 8     # big models on one chip: Llama-3.2-1B full fine-tune, Llama-3.1-8B QLoRA
#   bash benchmarks/tpu_check.sh --part 10    # Llama-3.2-3B full fine-tune, the update in the backward pass; the usual step's refusal
#   bash benchmarks/tpu_check.sh --part 11    # the longest contexts: Qwen2.5-0.5B full, Llama-3.1-8B QLoRA 4-bit
#   bash benchmarks/tpu_check.sh --part 9     # a scanned Qwen fit; the GPT example's first step, compile cache cold/warm, a hand loop beside it
#   bash benchmarks/tpu_check.sh --smoke      # every part on CPU in seconds (checks the script runs)
#   bash benchmarks/tpu_check.sh -- CMD ARG.. # one command with the parts' packages and environment
#
# What each part runs (each script under its own time limit; a failure is reported, the rest still runs):
#   1. benchmarks/gpt.py --device   GPT-2 small's shape (124 M, context 1024; part 5: GPT-2 medium's, 355 M):
#                                   tokens/s and MFU (6N + attention over the chip's peak) of fitjax
#                                   against the hand-written loop on the same model and step,
#                                   fitjax with its defaults on (bar, logger, checkpoints), the same
#                                   over 200 steps of 8-step epochs with checkpointing on and off
#                                   (what the default checkpoint costs the step), the share
#                                   of each step the device sat idle in a profiler trace of the fit,
#                                   and each side's time per op (`--tpu-options SPEC` adds a fit
#                                   compiled with an XLA:TPU option, fitjax.step.xla_tpu)
#   2. tests/accelerator            the tests that run on whatever JAX finds, here on the chip
#      benchmarks/overhead.py       the tiny MLP, MNIST MLP and small CNN against their naive hand
#                                   loops, with and without steps_per_execution
#   3. benchmarks/plan_device.py    the planner's memory and step time against fits on the chip, and a
#                                   configuration planned not to fit, run to show it does not
#   4. benchmarks/tpu_sweep.py      the profile-first table: the same step by hand with XLA's
#                                   attention and with the Pallas kernel (what each choice is worth)
#      benchmarks/generation.py     generation tokens/s with the KV cache against without
#   6. benchmarks/save_probe.py     GPT-2 small's step beside a save's copy and its transfer to the
#                                   host, and a fit traced across epoch ends with its saves' timings
#   7. benchmarks/lm_shapes.py      `fitjax.models` fits at published shapes with random weights, 8 x 1024
#                                   tokens a step, bf16-mixed: Qwen2.5-0.5B full (layers unrolled and
#                                   scanned), Llama-3.2-1B with LoRA rank 16: tokens/s, MFU, peak memory
#   8, 10, 11. lm_shapes.py         the same at shapes that fill a 16 GB chip (issue 62), each planned for
#                                   `tpu-v5e-1` deviceless first (`lm_shapes.py --plan tpu-v5e-1 ...`: its
#                                   predicted peak is beside each run below and in results/tpu-v5e/README.md)
# Each part writes JSON (the command, the commit, JAX and libtpu versions, the device kind, raw
# timings, derived ratios) under $FITJAX_RESULTS (default benchmarks/results/tpu-v5e), which are
# committed so every TPU figure in the docs names the run that produced it. The commit comes from
# git, or from $FITJAX_COMMIT where the tree travels without its .git (the device machine).
# What the machine lacks (flax, optax, orbax, rich, pyyaml from the machine's own package index;
# tensorboardX, qwix and zstandard from benchmarks/wheels/) is installed into a scratch folder, never into the system.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
python="${PYTHON:-python3}"
part=
smoke=0
while [ $# -gt 0 ]; do
  case "$1" in
    --smoke) smoke=1 ;;
    --part) part="${2:-}"; shift ;;
    --) shift; part=exec; break ;;  # the rest: one command run with the parts' environment
    -h|--help) sed -n '2,52p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "tpu_check.sh: unknown argument ${1@Q}; use --part 1 to 11 or --smoke (--help)" >&2; exit 2 ;;
  esac
  shift
done
case "$part" in
  1|2|3|4|5|6|7|8|9|10|11|exec) ;;
  "") [ "$smoke" -eq 1 ] || { echo "tpu_check.sh: choose --part 1 to 11 (each one 10-minute call), or --smoke" >&2; exit 2; } ;;
  *) echo "tpu_check.sh: --part must be 1 to 11, got ${part@Q}" >&2; exit 2 ;;
esac

export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
export FITJAX_COMMIT="${FITJAX_COMMIT:-$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)}"
export FITJAX_RESULTS="${FITJAX_RESULTS:-$root/benchmarks/results/tpu-v5e}"
if [ "$smoke" -eq 1 ]; then
  FITJAX_RESULTS="$(mktemp -d)"
  # the smoke checks that each part runs, not how fast: XLA's CPU backend compiles without LLVM's
  # costlier passes (the smoke in ~2/3 of the CPU time; its programs run slower)
  case "${XLA_FLAGS:-}" in *xla_backend_optimization_level*) ;; *)
    export XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true" ;;
  esac
fi
mkdir -p "$FITJAX_RESULTS"
# programs compiled once per machine: a second fit of the same step is a cache hit
export JAX_COMPILATION_CACHE_DIR="${JAX_COMPILATION_CACHE_DIR:-${TMPDIR:-/tmp}/fitjax-tpu-check-cache}"

if ! "$python" -c "import flax, optax, orbax.checkpoint, rich, yaml, tensorboardX, qwix, filelock, zstandard" 2>/dev/null; then
  site="${TMPDIR:-/tmp}/fitjax-tpu-check-site"
  if [ -d /opt/pypi/simple ]; then
    PIP_CONFIG_FILE=/dev/null "$python" -m pip install --isolated -q --only-binary=:all: \
      --index-url file:///opt/pypi/simple --target "$site" flax optax orbax-checkpoint rich pyyaml filelock 2>&1 \
      | grep -v -e WARNING -e notice
  fi
  "$python" -m pip install -q --no-index --no-deps --no-compile --target "$site" "$here"/wheels/*.whl || exit 1
  export PYTHONPATH="$PYTHONPATH:$site"  # after the machine's own JAX: the index's copy never hides it
fi

status=0
step() {  # step SECONDS NAME COMMAND...: one part under its limit; a failure is reported, the rest still runs
  local limit="$1" name="$2"
  shift 2
  echo
  echo "== $name (limit ${limit}s): $*"
  local start=$SECONDS
  # each part's output also goes to its own log beside its JSON, line by line: a part cut short
  # by its limit (or the call's) still leaves what it printed
  timeout "$limit" "$@" 2>&1 | tee "$FITJAX_RESULTS/$name.log"
  local rc=${PIPESTATUS[0]}
  if [ "$rc" -ne 0 ]; then
    echo "== $name FAILED (exit $rc$([ "$rc" -eq 124 ] && echo ', over its time limit'))"
    status=1
  fi
  echo "== $name: $((SECONDS - start))s"
}

echo "== machine"
"$python" "$here/_machine.py" --json "$FITJAX_RESULTS/machine.json"
# fitjax must find the same devices JAX finds alone (it keeps libtpu out only where no TPU is);
# one process at a time may hold a TPU chip, so each look is a process of its own
alone=$("$python" -c "import jax; print(jax.devices()[0].platform)" 2>/dev/null)
found=$("$python" -c "import fitjax, jax; print(jax.devices()[0].platform)" 2>/dev/null)
echo "JAX alone finds ${alone:-nothing}; after importing fitjax: ${found:-nothing}"
if [ "$alone" != "$found" ]; then echo "== fitjax hides this machine's devices: stopping"; exit 1; fi

out="$FITJAX_RESULTS"
if [ "$smoke" -eq 1 ]; then
  step 120 gpt "$python" "$here/gpt.py" --smoke --device --json "$out/gpt.json" --trace "$out/gpt_trace.json" \
    --epoch-steps 1 --tpu-options xla_tpu_scoped_vmem_limit_kib=98304
  step 120 tpu_sweep "$python" "$here/tpu_sweep.py" --smoke --out "$out/sweep.json"
  step 120 overhead "$python" "$here/overhead.py" --smoke --only defaults --json "$out/overhead.json"
  step 150 plan_device "$python" "$here/plan_device.py" --smoke --json "$out/plan.json"
  # collected only: the suite runs tests/accelerator itself on CPU; on the chip part 2 runs them
  step 150 accelerator "$python" -m pytest -q --collect-only -p no:cacheprovider "$root/tests/accelerator"
  step 120 generation "$python" "$here/generation.py" --smoke
  step 120 save_probe "$python" "$here/save_probe.py" --smoke --json "$out/save_probe.json"
  step 120 lm_shapes "$python" "$here/lm_shapes.py" --smoke --json "$out/lm.json"
  # one length: the search's code path planned once (each length planned compiles the step again)
  step 120 lm_shapes_memory "$python" "$here/lm_shapes.py" --smoke --moments int8 --precision bf16-true \
    --loss-chunk 64 --longest 128 --json "$out/lm-memory.json"
  step 150 lm_shapes_qlora "$python" "$here/lm_shapes.py" --smoke --lora 4 --quantize int4 --scan-layers \
    --remat none,full --json "$out/lm-qlora.json"
  step 120 lm_shapes_in_backward "$python" "$here/lm_shapes.py" --smoke --precision bf16-true --moments int8 \
    --scan-layers --remat full --update-in-backward --json "$out/lm-in-backward.json"
else
  # limits from runs on one v5e chip (JAX 0.10.2): each part under 10 minutes (each compile of
  # GPT-2 small's step takes ~40 s there, medium's longer)
  if [ "$part" = 1 ]; then
    step 570 gpt "$python" "$here/gpt.py" --device --shape gpt2-small --repeats 1 --warmup 3 --steps 40 \
      --epoch-steps 8 --epoch-ends-steps 200 --json "$out/gpt.json" --trace "$out/gpt_trace.json"
  fi
  if [ "$part" = 2 ]; then
    step 90 accelerator "$python" -m pytest -q -p no:cacheprovider "$root/tests/accelerator" \
      --junit-xml "$out/accelerator.xml"
    step 240 overhead "$python" "$here/overhead.py" --device --only defaults --only spe --repeats 1 \
      --json "$out/overhead.json"
  fi
  if [ "$part" = 3 ]; then  # each plan and each fit in a process of its own (one holds the chip at a time)
    step 540 plan_device "$python" "$here/plan_device.py" --remat none --steps 5 --warmup 3 --json "$out/plan.json"
  fi
  if [ "$part" = 4 ]; then
    step 300 tpu_sweep "$python" "$here/tpu_sweep.py" --peak-tflops 197 --out "$out/sweep.json" \
      --config small:attn=xla,batch=8 --config small:attn=splash,batch=8 --config small:attn=fj,batch=8
    step 200 generation "$python" "$here/generation.py" --device --json "$out/generation.json"
  fi
  if [ "$part" = 5 ]; then  # ~160 s on the chip (gpt-medium-9bd78d2.json)
    step 400 gpt_medium "$python" "$here/gpt.py" --device --shape gpt2-medium --no-defaults --repeats 1 \
      --warmup 3 --steps 20 --json "$out/gpt-medium.json"
  fi
  if [ "$part" = 6 ]; then  # ~200 s on the chip (save-probe-66be6e3.json)
    step 400 save_probe "$python" "$here/save_probe.py" --device --json "$out/save-probe.json"
  fi
  if [ "$part" = 7 ]; then  # each fit in a process of its own (one holds the chip at a time)
    step 200 lm_qwen "$python" "$here/lm_shapes.py" --device --shape qwen2.5-0.5b --json "$out/lm-qwen.json"
    step 200 lm_qwen_scan "$python" "$here/lm_shapes.py" --device --shape qwen2.5-0.5b --scan-layers \
      --remat full --json "$out/lm-qwen-scan.json"
    step 200 lm_llama_lora "$python" "$here/lm_shapes.py" --device --shape llama-3.2-1b --lora 16 \
      --json "$out/lm-llama1b-lora.json"
  fi
  # Parts 8, 10 and 11: issue 62's runs, each planned for tpu-v5e-1 first (`lm_shapes.py --plan tpu-v5e-1` and
  # the same options, deviceless): "planned" is XLA's peak of the train step (the state's init beside it),
  # against the chip's 15.75 GiB. Most important first: a run cut short by the call's limit is the last.
  if [ "$part" = 8 ]; then
    # Llama-3.2-1B full fine-tune, 8 x 1024: bfloat16 weights (torchtune's full fine-tunes), 8-bit AdamW,
    # layers unrolled, remat full (`--remat none,full` lets the planner pick on the chip, at ~75 s a
    # plan of the unrolled step: more than this part's time). Planned without remat: 6.82 GiB at 2 of its 16 layers, 9.46 at 4
    # (1.32 GiB a layer: ~25 GiB unless XLA rematerializes); remat full ~10 GiB extrapolated (~0.3 GiB a
    # layer); scanned with remat full 15.41 GiB, 0.34 free (each stacked leaf's 8-bit update in float32)
    # Remat dots (planned 15.09 GiB, 0.65 free): 47.5% MFU at 0c3d643, against 44.4% with remat full
    step 300 lm_llama1b_full "$python" "$here/lm_shapes.py" --device --shape llama-3.2-1b --batch 8 \
      --precision bf16-true --moments int8 --remat dots --warmup 2 --steps 5 --json "$out/lm-llama1b-full.json"
    # Llama-3.1-8B QLoRA (rank 16 on every projection), 4 x 1024, layers scanned (each program one layer
    # long: Qwen's scanned init and compile took 11.5 s and 11.7 s cold on the chip, lm-qwen-scan-ecdef7b.log),
    # remat full, an int8 base. Planned: 14.59 GiB (1.16 free: params 10.58, temporaries 3.70), init
    # 10.89 GiB, 1.77 s a step
    step 150 lm_llama8b_qlora_int8 "$python" "$here/lm_shapes.py" --device --shape llama-3.1-8b --batch 4 \
      --lora 16 --quantize int8 --scan-layers --remat full --warmup 2 --steps 5 --json "$out/lm-llama8b-qlora-int8.json"
    # The same with a 4-bit base. Planned: 11.34 GiB (4.41 free), init 7.64 GiB
    step 110 lm_llama8b_qlora_int4 "$python" "$here/lm_shapes.py" --device --shape llama-3.1-8b --batch 4 \
      --lora 16 --quantize int4 --scan-layers --remat full --warmup 2 --steps 4 --json "$out/lm-llama8b-qlora-int4.json"
  fi
  if [ "$part" = 10 ]; then
    # Llama-3.2-3B full fine-tune: bfloat16 weights, 8-bit AdamW, layers scanned, remat full, and each
    # layer's optimizer update inside the backward pass (`Trainer(update_in_backward=True)`: no
    # whole-model gradient held). Planned deviceless: 1 x 1024 15.20 GiB (0.55 free: params 5.98,
    # optimizer 6.08, temporaries 3.13; init 12.07), 2 x 1024 15.33 GiB (0.41 free). The usual step at
    # 1 x 1024 plans 20.46 GiB: run last; the chip refused it at 0c3d643 (lm-llama3b-full-refused-0c3d643.log).
    step 240 lm_llama3b_full_in_backward "$python" "$here/lm_shapes.py" --device --shape llama-3.2-3b --batch 1 \
      --precision bf16-true --moments int8 --scan-layers --remat full --update-in-backward --warmup 1 --steps 3 \
      --json "$out/lm-llama3b-full-in-backward.json"
    step 200 lm_llama3b_full_in_backward_b2 "$python" "$here/lm_shapes.py" --device --shape llama-3.2-3b --batch 2 \
      --precision bf16-true --moments int8 --scan-layers --remat full --update-in-backward --warmup 1 --steps 3 \
      --json "$out/lm-llama3b-full-in-backward-b2.json"
    step 120 lm_llama3b_full "$python" "$here/lm_shapes.py" --device --shape llama-3.2-3b --batch 1 \
      --precision bf16-true --moments int8 --scan-layers --remat full --warmup 1 --steps 2 \
      --json "$out/lm-llama3b-full.json"
  fi
  if [ "$part" = 11 ]; then
    # The longest context at batch 1 (splash attention, layers scanned, remat full): the longest of the
    # listed lengths the planner fits on the chip itself (Trainer.plan on the device, 5% kept free; a
    # binary search, ~3 compiles), then 1 + 3 steps at it. Planned deviceless: Qwen at 65536 17.22 GiB
    # (temporaries 11.70; init 5.52), so its longest is below; 8B's: not planned here (CPU time ran out)
    step 300 lm_qwen_context "$python" "$here/lm_shapes.py" --device --shape qwen2.5-0.5b --batch 1 \
      --scan-layers --remat full --longest 16384,32768,40960,49152,57344,65536 --warmup 1 --steps 3 \
      --json "$out/lm-qwen-context.json"
    step 290 lm_llama8b_context "$python" "$here/lm_shapes.py" --device --shape llama-3.1-8b --batch 1 \
      --lora 16 --quantize int4 --scan-layers --remat full --longest 8192,16384,24576,32768,49152,65536 \
      --warmup 1 --steps 3 --json "$out/lm-llama8b-context.json"
  fi
  if [ "$part" = exec ]; then
    step 590 exec "$@"
  fi
  if [ "$part" = 9 ]; then  # a scanned fit; the GPT example's first step with the compile cache cold and warm,
    # and a hand-written loop of its model and step beside it (first_step_hand.py, its own cache cold and warm)
    step 200 lm_qwen_scan "$python" "$here/lm_shapes.py" --device --shape qwen2.5-0.5b --scan-layers \
      --remat full --json "$out/lm-qwen-scan.json"
    step 390 first_step "$python" "$here/first_output.py" --example gpt.py --hand --no-cold --runs 1 \
      --compile-cache "$out/cache" --json "$out/first-step.json" -- --preset gpt2-small --max-steps 30 --sample-length 0
    rm -rf "$out/cache" "$out/cache-hand"
  fi
fi
echo
echo "== tpu_check: $([ "$status" -eq 0 ] && echo ok || echo 'a step FAILED'), ${SECONDS}s in all (results: $out)"
exit "$status"
