"""XLA:TPU's choices (`fitjax.step.xla_tpu`): the compiler options every TPU program is given and
how a run switches each one (on other platforms nothing changes).
And with libtpu installed (`[dev]`, `[tpu-plan]`) and no TPU, fitjax programs run as if libtpu were
not there: no probe lines, a profiled fit completes, the planner's TPU targets still compile; run
as users run, in fresh processes with no `JAX_PLATFORMS` and no `XLA_FLAGS`."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fitjax import _bootstrap
from fitjax.step import jitted, xla_tpu


def test_tpu_programs_get_the_defaults_and_a_programs_own_options_win(monkeypatch):
    monkeypatch.delenv(xla_tpu.OPTIONS_ENV, raising=False)
    assert (jitted.compiler_options("tpu") or {}) == xla_tpu.DEFAULT_OPTIONS
    assert jitted.compiler_options("tpu", {"xla_tpu_scoped_vmem_limit_kib": 1})["xla_tpu_scoped_vmem_limit_kib"] == 1
    assert jitted.compiler_options("gpu") is None
    assert not any(name.startswith("xla_tpu") for name in jitted.compiler_options("cpu"))


@pytest.mark.parametrize("spec, expected", [
    ("none", {}),
    ("-xla_tpu_scoped_vmem_limit_kib", {}),
    ("xla_tpu_scoped_vmem_limit_kib=65536", {"xla_tpu_scoped_vmem_limit_kib": "65536"}),
    ("none, xla_a=true --xla_b=1", {"xla_a": "true", "xla_b": "1"}),
    ("", xla_tpu.DEFAULT_OPTIONS),
])
def test_the_environment_switches_each_option(monkeypatch, spec, expected):
    monkeypatch.setenv(xla_tpu.OPTIONS_ENV, spec)
    assert (jitted.compiler_options("tpu") or {}) == expected


def test_a_malformed_entry_says_the_forms_allowed(monkeypatch):
    monkeypatch.setenv(xla_tpu.OPTIONS_ENV, "xla_tpu_scoped_vmem_limit_kib")
    with pytest.raises(ValueError, match="'none', '-name' or 'name=value'"):
        jitted.compiler_options("tpu")


# --------------------------------------------------------------------- libtpu without a TPU

ROOT = Path(__file__).resolve().parents[2]

# What libtpu writes when it looks for a TPU that is not there: glog lines ("E0000 00:00:...
# common_lib.cc:906] INVALID_ARGUMENT: ..."), "Failed to find host bounds for accelerator type",
# "WARNING: Logging before InitGoogle()", "=== Source Location Trace: ===", a segfault's report.
LIBTPU_LINE = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d|TPU_|libtpu|TPU accelerator|accelerator type|InitGoogle|"
                         r"Source Location Trace|tfrc/runtime|SIGSEGV|coredump", re.MULTILINE)

needs_libtpu_without_tpu = pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None or _bootstrap.tpu_may_be_present(),
    reason="about a machine with libtpu installed (`pip install -e '.[dev]'`) and no TPU")


def run_as_a_user(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), str(ROOT / "tests"), env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


PLANNED_THEN_PROFILED = textwrap.dedent("""
    import sys

    import numpy as np
    from helpers import DenseRegression

    import fitjax as fj

    rng = np.random.default_rng(0)
    data = fj.DataLoader({"x": rng.normal(size=(64, 4)).astype(np.float32),
                          "y": rng.normal(size=(64, 1)).astype(np.float32)}, batch_size=16)
    plan = fj.plan(DenseRegression(), data, target="tpu-v5e-1")  # libtpu loaded into this process
    print("planned for", plan.device_kind)
    trainer = fj.Trainer(max_steps=3, profiler="jax", default_root_dir=sys.argv[1], enable_progress_bar=False,
                         enable_model_summary=False, logger=False, enable_checkpointing=False)
    trainer.fit(DenseRegression(), data)
    print("fitted", trainer.global_step, "steps on", trainer.devices[0].platform)
""")


@needs_libtpu_without_tpu
def test_a_profiled_fit_after_a_tpu_plan_completes_and_prints_nothing_from_libtpu(tmp_path):
    (tmp_path / "fit.py").write_text(PLANNED_THEN_PROFILED)
    done = run_as_a_user(["fit.py", str(tmp_path / "root")], tmp_path)
    said = done.stdout + done.stderr
    assert done.returncode == 0, said[-4000:]  # was a segmentation fault (-11, exit 139 in a shell)
    assert "planned for TPU v5 lite" in said and "fitted 3 steps on cpu" in said
    assert list((tmp_path / "root").rglob("*.xplane.pb")), "the profiler wrote no trace"
    assert not LIBTPU_LINE.search(said), said


@needs_libtpu_without_tpu
def test_the_digits_example_prints_nothing_from_libtpu(tmp_path):
    done = run_as_a_user([str(ROOT / "examples" / "digits.py"), "--epochs", "1", "--batch-size", "256",
                          "--root-dir", str(tmp_path)], tmp_path)
    said = done.stdout + done.stderr
    assert done.returncode == 0 and "validation accuracy" in said, said[-4000:]
    assert not LIBTPU_LINE.search(said), said


@pytest.mark.parametrize("variable, value, present", [
    ("TPU_ACCELERATOR_TYPE", "v5litepod-8", True),  # set on TPU VMs
    ("TPU_WORKER_HOSTNAMES", "10.0.0.2,10.0.0.3", True),
    ("JAX_FORCE_TPU_INIT", "1", True),
    # set by JAX or libtpu themselves on any machine, and inherited by child processes
    ("TPU_LIBRARY_PATH", "/somewhere/libtpu.so", False),
    ("TPU_SKIP_MDS_QUERY", "1", False),
])
@needs_libtpu_without_tpu
def test_a_tpu_variable_set_by_the_machine_or_the_user_keeps_the_tpu(monkeypatch, variable, value, present):
    monkeypatch.setenv(variable, value)
    assert _bootstrap.tpu_may_be_present() is present


def test_nothing_changes_once_the_backends_have_started():
    import jax

    jax.devices()
    assert _bootstrap.skip_absent_tpu() is False
