"""Compile once per machine: fitjax's persistent compile cache (`Trainer(compile_cache=...)`)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import fitjax as fj
import jax
import pytest
from fitjax.loop import _compile_cache
from helpers import Regressor, persistent_compile_cache, quiet_trainer, regression_data

SCRIPT = Path(__file__).with_name("compile_cache_fit.py")


def _run(folder: Path, **extra_env: str) -> dict:
    # every program stored, however fast it compiled: a threshold the user sets is kept
    env = {**os.environ, "FITJAX_COMPILE_CACHE": str(folder), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
           **extra_env}
    done = subprocess.run([sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_second_process_reads_every_program_back_and_compiles_nothing(tmp_path):
    first = _run(tmp_path / "xla")
    # `import fitjax` leaves JAX's cache as it was; the fit turns fitjax's on
    assert first["after_import"] is None and first["after_fit"] == str(tmp_path / "xla")
    assert "jit_train_step" in first["misses"] and not first["hits"]
    # compressed with zstandard (a dependency; JAX's zlib fallback reads a TPU train step 6x slower)
    stored = list((tmp_path / "xla").glob("*-cache"))
    assert stored and all(p.read_bytes()[:4] == b"\x28\xb5\x2f\xfd" for p in stored)  # zstd's frame magic
    second = _run(tmp_path / "xla")
    assert second["misses"] == [], second  # nothing compiled: every program read back
    assert {"jit_train_step", "jit_eval_step", "jit_init"} <= set(second["hits"])


def test_without_filelock_the_cache_still_works_unbounded(tmp_path):
    # JAX bounds the size with `filelock`; without it, a bounded cache would fail to open and
    # then store nothing (seen on a machine whose packages were installed one by one)
    first = _run(tmp_path / "xla", HIDE_FILELOCK="1")
    assert "jit_train_step" in first["misses"]
    second = _run(tmp_path / "xla", HIDE_FILELOCK="1")
    assert second["misses"] == [] and "jit_train_step" in second["hits"], second


def test_a_cache_the_user_configured_is_left_alone(tmp_path):
    with persistent_compile_cache(tmp_path / "mine"):
        trainer = quiet_trainer(max_steps=1, strategy="single")
        trainer.fit(Regressor(), fj.DataLoader(regression_data(n=32), batch_size=16))
        assert jax.config.jax_compilation_cache_dir == str(tmp_path / "mine")
        assert jax.config.jax_persistent_cache_min_compile_time_secs == 0  # the user's threshold too
        assert _compile_cache.use(True) is None


def test_fitjax_cache_is_on_at_fit_bounded_and_compile_cache_false_turns_it_off(tmp_path, monkeypatch):
    monkeypatch.setenv(_compile_cache.ENV_VAR, str(tmp_path / "env"))
    data = fj.DataLoader(regression_data(n=32), batch_size=16)
    quiet_trainer(max_steps=1, strategy="single").fit(Regressor(), data)
    assert jax.config.jax_compilation_cache_dir == str(tmp_path / "env")
    assert jax.config.jax_compilation_cache_max_size == _compile_cache.MAX_BYTES
    quiet_trainer(max_steps=1, strategy="single", compile_cache=str(tmp_path / "arg")).fit(Regressor(), data)
    assert jax.config.jax_compilation_cache_dir == str(tmp_path / "arg")
    quiet_trainer(max_steps=1, strategy="single", compile_cache=False).fit(Regressor(), data)
    assert jax.config.jax_compilation_cache_dir is None
    assert jax.config.jax_compilation_cache_max_size == -1  # JAX's setting given back


def test_the_folder_a_setting_names(tmp_path, monkeypatch):
    monkeypatch.delenv(_compile_cache.ENV_VAR, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert _compile_cache.folder_for(True) == str(tmp_path / "fitjax" / "xla")
    assert _compile_cache.folder_for(False) is None
    assert _compile_cache.folder_for(str(tmp_path / "x")) == str(tmp_path / "x")
    monkeypatch.setenv(_compile_cache.ENV_VAR, "0")  # off for every trainer, whatever it says
    assert _compile_cache.folder_for(True) is None and _compile_cache.folder_for(str(tmp_path)) is None
    monkeypatch.setenv(_compile_cache.ENV_VAR, str(tmp_path / "elsewhere"))
    assert _compile_cache.folder_for(True) == str(tmp_path / "elsewhere")
    with pytest.raises(ValueError, match=r"Trainer\(compile_cache=...\) takes True .* got 3"):
        fj.Trainer(compile_cache=3)
