#!/usr/bin/env bash
# The GPU check: one command, under 10 minutes on one H200, printing what the docs' GPU figures quote.
#
#   bash benchmarks/gpu_check.sh            # on a GPU machine (JAX with CUDA, torch, lightning)
#   bash benchmarks/gpu_check.sh --smoke    # on CPU with the dev extra: the same steps in seconds
#
# It runs, each under its own time limit so that the whole stays under 10 minutes:
#   1. benchmarks/many_runs.py      8 runs of the digits MLP and CNN in one program against 8 fits
#   2. benchmarks/plan_device.py       the planner's memory and step-time estimates for GPT-2 small's
#                                   shape against fits of the same configurations on the GPU
#   3. benchmarks/gpt.py --gpu      GPT-2 small's shape: tokens/s and MFU of fitjax against the
#                                   hand-written loop (bf16-mixed, accumulation 2, clip 1.0)
#   4. benchmarks/init_compile.py   GPT-2 small's init compiled with threefry as XLA operations and
#                                   as JAX's GPU kernel (what fit does on GPU): times, same bits
#   5. benchmarks/peers.py --gpu    fitjax against Lightning 2.6 (torch on CUDA) on the tiny MLP,
#                                   the MNIST-sized MLP and the small CNN of overhead.py
#   6. benchmarks/overhead.py       the overhead rows (tiny, clip, ema, steps_per_execution, defaults)
# fitjax runs from this checkout (PYTHONPATH), not an installed copy. What the machine lacks of
# fitjax's own dependencies travels as wheels in benchmarks/wheels/ (tensorboardX: the CUDA image
# has tensorboard but not it) and is installed into a scratch folder, never into the system.
# The first lines printed are the machine and the versions, so a pasted log says what it ran on.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
python="${PYTHON:-python3}"
smoke=0
case "${1:-}" in
  --smoke) smoke=1 ;;
  "") ;;
  -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; echo "  --smoke   every step on CPU in seconds (checks the script runs)"; exit 0 ;;
  *) echo "gpu_check.sh: unknown argument ${1@Q}; use --smoke or nothing (--help)" >&2; exit 2 ;;
esac

export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
if ! "$python" -c "import tensorboardX" 2>/dev/null; then
  site="${TMPDIR:-/tmp}/fitjax-gpu-check-site"
  "$python" -m pip install -q --no-index --no-deps --no-compile --target "$site" "$here"/wheels/*.whl || exit 1
  export PYTHONPATH="$PYTHONPATH:$site"
fi

if [ "$smoke" -eq 1 ]; then
  # the smoke checks that each step runs, not how fast: XLA's CPU backend compiles without LLVM's
  # costlier passes (its programs run slower)
  case "${XLA_FLAGS:-}" in *xla_backend_optimization_level*) ;; *)
    export XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true" ;;
  esac
fi

status=0
step() {  # step SECONDS NAME COMMAND...: runs one part under its limit; a failure is reported, the rest still runs
  local limit="$1" name="$2"
  shift 2
  echo
  echo "== $name (limit ${limit}s): $*"
  local start=$SECONDS
  timeout "$limit" "$@"
  local rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "== $name FAILED (exit $rc$([ "$rc" -eq 124 ] && echo ', over its time limit'))"
    status=1
  fi
  echo "== $name: $((SECONDS - start))s"
}

echo "== machine"
if command -v nvidia-smi >/dev/null; then nvidia-smi -L; fi
"$python" - <<'EOF'
import importlib.metadata as md
import jax
names = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "torch", "lightning", "keras")
def version(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return "-"
print(", ".join(f"{name} {version(name)}" for name in names))
print(f"JAX devices: {jax.devices()}")
EOF

if [ "$smoke" -eq 1 ]; then
  step 120 many_runs "$python" "$here/many_runs.py" --smoke
  # plan_device.py --smoke runs in tpu_check.sh --smoke, the same command: here its arguments only
  step 150 plan_device "$python" "$here/plan_device.py" --steps 10 --help
  step 120 gpt "$python" "$here/gpt.py" --smoke
  step 60 init_compile "$python" "$here/init_compile.py" --smoke
  step 120 peers "$python" "$here/peers.py" --smoke
  step 150 overhead "$python" "$here/overhead.py" --smoke
else
  # limits from its first run on an H200 (many_runs 80 s, plan_device 181 s with --steps 20 where
  # each fit's start took ~60 s, gpt 149 s, peers 58 s, overhead 86 s), less the ~40 s a GPT
  # state's init took to compile before it lowered threefry to the GPU kernel (init_compile
  # measures both: 55 s): 590 s in all
  step 90 many_runs "$python" "$here/many_runs.py"
  step 150 plan_device "$python" "$here/plan_device.py" --steps 10
  step 120 gpt "$python" "$here/gpt.py" --gpu --repeats 1 --steps 20
  step 70 init_compile "$python" "$here/init_compile.py"
  step 70 peers "$python" "$here/peers.py" --gpu --only lightning --repeats 1
  step 90 overhead "$python" "$here/overhead.py" --repeats 1
fi
echo
echo "== gpu_check: $([ "$status" -eq 0 ] && echo ok || echo 'a step FAILED'), ${SECONDS}s in all"
exit "$status"
