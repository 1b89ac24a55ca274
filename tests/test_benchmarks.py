"""Every script in benchmarks/ answers --help and runs its --smoke mode (so none can rot)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
SCRIPTS = sorted(p.name for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_"))


# what the check scripts' --smoke adds to XLA_FLAGS: XLA:CPU without LLVM's costlier passes (a smoke
# checks that a script runs, not how fast its programs do); `ported.py --smoke` 33 s of CPU -> 24.5 s
SMOKE_XLA_FLAGS = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"


@pytest.fixture(scope="session")  # not "module": this module's tests stay spread over the workers
def env(tmp_path_factory) -> dict[str, str]:
    """The scripts' environment: their own devices (none of the suite's XLA_FLAGS: the smokes'
    compile options alone), and one XLA persistent cache for all of them (a fresh folder per test
    worker): the smoke runs fit the same tiny models again and again, in one script and across
    scripts, and each program is compiled once. Measured on 2 cores: `overhead.py --smoke` alone
    43 s of CPU without it, 23 s with a cold one."""
    cache = tmp_path_factory.mktemp("xla_cache")
    return {**{k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}, "JAX_COMPILATION_CACHE_DIR": str(cache),
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
            "XLA_FLAGS": SMOKE_XLA_FLAGS}


def _run(script: str, *args: str, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCHMARKS / script), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=BENCHMARKS.parent, env=env)


def test_there_are_benchmarks():
    assert {"overhead.py", "memory.py", "techniques.py"} <= set(SCRIPTS)


# their --smoke runs inside `gpu_check.sh --smoke` (test_gpu_check_smoke), once
IN_GPU_CHECK = {"gpt.py", "init_compile.py", "many_runs.py", "overhead.py", "peers.py", "plan_device.py"}
# and these inside `tpu_check.sh --smoke` (test_tpu_check_smoke; `lm_shapes.py --smoke` four times,
# the first the command this test ran, `--json` added)
IN_TPU_CHECK = {"tpu_sweep.py", "generation.py", "save_probe.py", "lm_shapes.py"}


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_and_smoke(script, env):
    """`--help` answers before JAX is imported (a tenth of a second, not seconds), and `--smoke` runs."""
    helped = subprocess.run([sys.executable, "-X", "importtime", str(BENCHMARKS / script), "--help"],
                            capture_output=True, text=True, timeout=120, cwd=BENCHMARKS.parent, env=env)
    assert helped.returncode == 0, helped.stderr[-2000:]
    assert "--smoke" in helped.stdout
    assert not re.search(r"\|\s*jax$", helped.stderr, re.M), f"{script} --help imports JAX"
    if script in IN_GPU_CHECK | IN_TPU_CHECK:
        return
    smoke = _run(script, "--smoke", env=env, timeout=300)
    assert smoke.returncode == 0, smoke.stderr[-3000:]
    assert smoke.stdout.strip(), "a smoke run prints its table"


# both check scripts run gpt.py and overhead.py: on one worker, the second finds their programs
# in the worker's cache (and xdist starts the two long tests first, before the single tests)
@pytest.mark.xdist_group("check_scripts")
def test_gpu_check_smoke(env):
    """`benchmarks/gpu_check.sh --smoke` runs every step of the GPU check on CPU: the GPT table,
    the spe rows, the peers' table (the peers that are installed), the many-runs table, and says
    it passed (its planner step's smoke is the one `tpu_check.sh --smoke` runs)."""
    env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    done = subprocess.run(["bash", str(BENCHMARKS / "gpu_check.sh"), "--smoke"], capture_output=True, text=True,
                          timeout=600, cwd=BENCHMARKS.parent, env={**env, "PYTHON": sys.executable})
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    out = done.stdout
    for part in ("== many_runs:", "== plan_device:", "== gpt:", "== overhead:", "== peers:"):
        assert part in out, out[-3000:]
    assert "FAILED" not in out
    assert any(line.split()[:2] == ["cpu", "single"] for line in out.splitlines())  # gpt.py's table row
    assert "spe/shuf" in out and "fitjax/peer" in out
    assert out.rstrip().splitlines()[-1].startswith("== gpu_check: ok")


@pytest.mark.xdist_group("check_scripts")
def test_tpu_check_smoke(env, tmp_path):
    """`benchmarks/tpu_check.sh --smoke` runs every part of the TPU check on CPU: the GPT table with
    the defaults-on row, the profile-first sweep, the loop's rows, the planner against a fit and a
    configuration planned not to fit, the accelerator tests, generation, the save probe and the
    language models' fits (plain, 8-bit moments, QLoRA); every JSON file it writes names its
    command and commit."""
    import json

    env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    done = subprocess.run(["bash", str(BENCHMARKS / "tpu_check.sh"), "--smoke"], capture_output=True, text=True,
                          timeout=900, cwd=BENCHMARKS.parent,
                          env={**env, "PYTHON": sys.executable, "TMPDIR": str(tmp_path)})
    out = done.stdout
    assert done.returncode == 0, (out + done.stderr)[-3000:]
    for part in ("== gpt:", "== tpu_sweep:", "== overhead:", "== plan_device:", "== accelerator:", "== generation:",
                 "== save_probe:", "== lm_shapes:", "== lm_shapes_memory:", "== lm_shapes_qlora:"):
        assert part in out, out[-3000:]
    assert "defaults on" in out and "peak plan" in out and "rows, no remat: planned peak" in out
    assert re.search(r"^smoke, 2 x 128: [\d,]+ tokens/s", out, re.M), out[-3000:]  # lm_shapes.py's own line
    assert out.rstrip().splitlines()[-1].startswith("== tpu_check: ok")
    results = out.rstrip().rsplit("(results: ", 1)[1].rstrip(")")
    for name in ("machine.json", "gpt.json", "overhead.json", "plan.json", "sweep.json", "save_probe.json", "lm.json",
                 "lm-memory.json", "lm-qlora.json"):
        payload = json.loads((Path(results) / name).read_text())
        assert payload["command"] and payload.get("commit", "") != "", name


def test_the_trace_window_avoids_epoch_ends_and_names_its_idle_stretches(tmp_path):
    """`gpt.py --trace` profiles steady steps: a window that would hold an epoch end starts after
    it (818 rows of 16 with 2 micro-batches: 26 steps an epoch, the last of one batch); the idle
    share lists each stretch over 1 ms, as a checkpoint's copy at an epoch end makes one."""
    import gzip
    import json

    sys.path.insert(0, str(BENCHMARKS))
    try:
        from _trace import idle_share, steady_window
    finally:
        sys.path.remove(str(BENCHMARKS))
    assert steady_window(23, 26, 5) == 27  # steps 24..28 would cross the end after step 26
    assert steady_window(20, 26, 5) == 20  # 21..25: inside epoch 0
    assert steady_window(21, 26, 5) == 21  # 22..26: the epoch's end comes after the window's
    assert steady_window(23, 4, 5) == 23  # epochs shorter than the window: as asked
    events = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/device:TPU:0"}},
              {"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "XLA Modules"}}]
    for start in (0, 258_310, 900_000):  # three 258.3 ms steps, 383.4 ms idle before the third
        events.append({"ph": "X", "pid": 1, "tid": 2, "ts": start, "dur": 258_300, "name": "jit_train_step"})
    (tmp_path / "host").mkdir()
    with gzip.open(tmp_path / "host" / "t.trace.json.gz", "wt") as file:
        json.dump({"traceEvents": events}, file)
    idle = idle_share(str(tmp_path))
    assert idle["programs"] == 3 and idle["gaps_ms"] == [[516.61, 383.39]]
    assert abs(idle["idle_share"] - (1 - 774.9 / 1158.3)) < 1e-9
