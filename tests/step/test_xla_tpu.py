"""XLA:TPU's choices (`fitjax.step.xla_tpu`): the compiler options every TPU program is given and
how a run switches each one, and the splash kernel's blocks. On other platforms nothing changes."""

from __future__ import annotations

import pytest

from fitjax.step import jitted, xla_tpu


def test_tpu_programs_get_the_defaults_and_a_programs_own_options_win(monkeypatch):
    monkeypatch.delenv(xla_tpu.OPTIONS_ENV, raising=False)
    assert jitted.compiler_options("tpu") == xla_tpu.DEFAULT_OPTIONS
    assert jitted.compiler_options("tpu", {"xla_tpu_scoped_vmem_limit_kib": 1})["xla_tpu_scoped_vmem_limit_kib"] == 1
    assert jitted.compiler_options("gpu") is None
    assert not any(name.startswith("xla_tpu") for name in jitted.compiler_options("cpu"))


@pytest.mark.parametrize("spec, expected", [
    ("none", {}),
    ("-xla_tpu_scoped_vmem_limit_kib", {}),
    ("xla_tpu_scoped_vmem_limit_kib=65536", {"xla_tpu_scoped_vmem_limit_kib": "65536"}),
    ("none, xla_a=true --xla_b=1", {"xla_a": "true", "xla_b": "1"}),
    ("", {"xla_tpu_scoped_vmem_limit_kib": 98304}),
])
def test_the_environment_switches_each_option(monkeypatch, spec, expected):
    monkeypatch.setenv(xla_tpu.OPTIONS_ENV, spec)
    assert (jitted.compiler_options("tpu") or {}) == expected


def test_a_malformed_entry_says_the_forms_allowed(monkeypatch):
    monkeypatch.setenv(xla_tpu.OPTIONS_ENV, "xla_tpu_scoped_vmem_limit_kib")
    with pytest.raises(ValueError, match="'none', '-name' or 'name=value'"):
        jitted.compiler_options("tpu")


@pytest.mark.parametrize("lengths, head_dim, largest, expected", [
    ((1024, 1024), 64, None, xla_tpu.SplashBlocks(512, 512)),
    ((384, 1280), 128, None, xla_tpu.SplashBlocks(384, 256)),
    ((1024, 1024), 64, "256", xla_tpu.SplashBlocks(256, 256)),
    ((1000, 1000), 64, None, None),
    ((1024, 1024), 48, None, None),
])
def test_splash_blocks_divide_the_lengths(monkeypatch, lengths, head_dim, largest, expected):
    if largest is None:
        monkeypatch.delenv(xla_tpu.BLOCK_ENV, raising=False)
    else:
        monkeypatch.setenv(xla_tpu.BLOCK_ENV, largest)
    assert xla_tpu.splash_blocks(*lengths, head_dim) == expected


def test_the_attention_kernel_is_chosen_from_the_environment(monkeypatch):
    monkeypatch.delenv(xla_tpu.ATTENTION_ENV, raising=False)
    assert xla_tpu.attention_kernel() == "splash"
    monkeypatch.setenv(xla_tpu.ATTENTION_ENV, "xla")
    assert xla_tpu.attention_kernel() == "xla"
    monkeypatch.setenv(xla_tpu.ATTENTION_ENV, "flash")
    with pytest.raises(ValueError, match="'splash', 'splash-fused', 'xla'"):
        xla_tpu.attention_kernel()
