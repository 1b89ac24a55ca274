"""Every script in benchmarks/ answers --help and runs its --smoke mode (so none can rot)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
SCRIPTS = sorted(p.name for p in BENCHMARKS.glob("*.py"))


def _run(script: str, *args: str, timeout: float) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # the script's own devices
    return subprocess.run([sys.executable, str(BENCHMARKS / script), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=BENCHMARKS.parent, env=env)


def test_there_are_benchmarks():
    assert {"overhead.py", "memory.py", "techniques.py"} <= set(SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_and_smoke(script):
    helped = _run(script, "--help", timeout=120)
    assert helped.returncode == 0, helped.stderr[-2000:]
    assert "--smoke" in helped.stdout
    smoke = _run(script, "--smoke", timeout=300)
    assert smoke.returncode == 0, smoke.stderr[-3000:]
    assert smoke.stdout.strip(), "a smoke run prints its table"
