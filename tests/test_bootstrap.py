"""What `import fitjax` changes in the process: exactly what `fitjax._bootstrap` documents, and
nothing with `FITJAX_BOOTSTRAP=0`. Each import runs in a fresh interpreter (this one imported
fitjax long ago), which compares the SIGINT handler, `gc.callbacks`, the environment and JAX's
backend factories before and after."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import sigint_as

from fitjax import _bootstrap

ROOT = Path(__file__).resolve().parents[1]

_SCRIPT = """
import gc, json, os, signal

import jax  # imported first: its own changes (gc callbacks, TPU_* variables) are not fitjax's
from jax._src import xla_bridge

def snapshot():
    return {"sigint": getattr(signal.getsignal(signal.SIGINT), "__qualname__", None),
            "gc": [getattr(c, "__qualname__", repr(c)) for c in gc.callbacks],
            "env": dict(os.environ),
            "factories": {name: getattr(r.factory, "__qualname__", repr(r.factory))
                          for name, r in xla_bridge._backend_factories.items()},
            "started": xla_bridge.backends_are_initialized()}

before = snapshot()
import fitjax
print(json.dumps({"before": before, "after": snapshot()}))
"""


def _import_fitjax(**env: str) -> tuple[dict, dict]:
    # a user's environment: not the suite's platform and flags (conftest.py sets both)
    base = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS", _bootstrap.OPT_OUT_VAR)}
    done = subprocess.run(sigint_as("SIG_DFL", [sys.executable, "-c", _SCRIPT]), cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**base, "PYTHONPATH": str(ROOT), **env})
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    return found["before"], found["after"]


def _changed_env(before: dict, after: dict) -> dict:
    return {k: (before["env"].get(k), after["env"].get(k)) for k in before["env"].keys() | after["env"].keys()
            if before["env"].get(k) != after["env"].get(k)}


@pytest.mark.parametrize("value", ["0", "off"])
def test_the_opt_out_leaves_the_process_as_it_was(value):
    before, after = _import_fitjax(FITJAX_BOOTSTRAP=value)
    assert before["sigint"] == after["sigint"] == "default_int_handler"
    assert after["gc"] == before["gc"]
    assert _changed_env(before, after) == {}
    assert after["factories"] == before["factories"]
    assert after["started"] is False  # importing fitjax starts no backend either way


def test_the_default_makes_exactly_the_documented_changes():
    before, after = _import_fitjax()
    # 1. Ctrl-C: fitjax's handler, and its collection tracker first among gc's callbacks
    assert before["sigint"] == "default_int_handler" and after["sigint"] == "_on_sigint"
    assert after["gc"] == ["_Collection.track", *before["gc"]]
    # 2. XLA:CPU's depth-first scheduler: the one environment change (jaxlib 0.10 is a checked release)
    assert _changed_env(before, after) == {"XLA_FLAGS": (None, _bootstrap.SCHEDULER_FLAG)}
    # 3. the TPU's factory replaced where libtpu registered one and no TPU is here; nothing else
    expected = dict(before["factories"])
    if "tpu" in expected and not _bootstrap.tpu_may_be_present():
        expected["tpu"] = "_no_tpu"
    assert after["factories"] == expected
    assert after["started"] is False


def test_the_opt_out_is_read_from_the_variable(monkeypatch):
    for value, on in [("", True), ("1", True), ("0", False), ("false", False), ("No", False), ("OFF", False)]:
        monkeypatch.setenv(_bootstrap.OPT_OUT_VAR, value)
        assert _bootstrap.enabled() is on, value
    monkeypatch.delenv(_bootstrap.OPT_OUT_VAR)
    assert _bootstrap.enabled() is True
