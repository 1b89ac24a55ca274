"""`Trainer(accelerator=...)` and the one line a fit starts with, on the 8 virtual CPU devices."""

from __future__ import annotations

import logging

import jax
import pytest
from helpers import Regressor, quiet_trainer, regression_data

import fitjax as fj


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@pytest.fixture
def fitjax_lines():
    handler = _Lines()
    logger = logging.getLogger("fitjax")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)  # pytest configured logging, so fitjax left the level alone
    yield handler.lines
    logger.removeHandler(handler)
    logger.setLevel(level)


@pytest.mark.parametrize(("strategy", "devices", "precision", "expected"), [
    ("dp", 4, "bf16-mixed", "fitjax: cpu, 4/8 devices used, 1 process (LightningEnvironment, rank 0)\n  strategy DataParallel (mesh data=4), "
                            "precision bf16-mixed"),
    ("fsdp", "auto", "32-true", "fitjax: cpu, 8/8 devices used, 1 process (LightningEnvironment, rank 0)\n  strategy FSDP (mesh data=1 fsdp=8 tensor=1), "
                                "precision 32-true"),
])
def test_fit_starts_with_one_line_naming_platform_devices_strategy_mesh_and_precision(
        fitjax_lines, strategy, devices, precision, expected):
    trainer = quiet_trainer(accelerator="cpu", strategy=strategy, devices=devices, precision=precision, max_steps=1)
    trainer.fit(Regressor(), fj.DataLoader(regression_data(n=64), batch_size=32))
    assert fitjax_lines == [expected]
    assert [d.platform for d in trainer.devices] == ["cpu"] * len(trainer.devices)


def test_accelerator_auto_is_jax_default_backend():
    assert quiet_trainer(accelerator="auto").devices == jax.devices()


def test_missing_backend_names_the_backends_present_and_the_fix(monkeypatch):
    with pytest.raises(RuntimeError, match=r"accelerator='gpu'.*no gpu backend.*backends present: cpu.*jax\[cuda12\]"):
        fj.Trainer(accelerator="gpu")
    with pytest.raises(RuntimeError, match=r"accelerator='tpu'.*backends present: cpu\. To use it.*jax\[tpu\]"):
        fj.Trainer(accelerator="tpu")
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")  # a user's limit is named where it explains the absence
    with pytest.raises(RuntimeError, match=r"accelerator='tpu'.*backends present: cpu.*JAX_PLATFORMS='cpu'"):
        fj.Trainer(accelerator="tpu")


def test_unknown_accelerator_lists_the_names():
    with pytest.raises(ValueError, match=r"accelerator=.*'auto', 'cpu', 'gpu', 'tpu'.*got 'mps'"):
        fj.Trainer(accelerator="mps")
