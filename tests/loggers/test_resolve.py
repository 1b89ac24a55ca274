"""resolve_loggers, the public names of fitjax.loggers, and the examples in their docstrings."""

import doctest
import importlib

import pytest

import fitjax.loggers
from fitjax.loggers import CSVLogger, Logger, TensorBoardLogger, resolve_loggers


def test_public_names():
    assert fitjax.loggers.__all__ == sorted(fitjax.loggers.__all__)
    assert fitjax.loggers.__all__ == ["CSVLogger", "Logger", "MLFlowLogger", "TensorBoardLogger", "WandbLogger",
                                      "resolve_loggers"]


def test_accepted_forms(tmp_path):
    (default,) = resolve_loggers(True, default_root_dir=tmp_path)
    assert isinstance(default, TensorBoardLogger)
    assert default.log_dir == tmp_path / "fitjax_logs" / "version_0"
    assert resolve_loggers(False, default_root_dir=tmp_path) == []
    assert resolve_loggers(None, default_root_dir=tmp_path) == []
    csv_logger, tb_logger = CSVLogger(tmp_path), TensorBoardLogger(tmp_path)
    assert resolve_loggers(csv_logger, default_root_dir=tmp_path) == [csv_logger]
    assert resolve_loggers((csv_logger, tb_logger), default_root_dir=tmp_path) == [csv_logger, tb_logger]
    assert resolve_loggers([], default_root_dir=tmp_path) == []
    assert list(tmp_path.iterdir()) == []  # resolving writes nothing


@pytest.mark.parametrize(
    ("logger", "match"),
    [
        ("tensorboard", r"must be True .* got 'tensorboard' \(str\)\. For TensorBoard pass `logger=True`"),
        (1, r"must be True .*a list/tuple of Loggers; got 1 \(int\)"),
        ([TensorBoardLogger("unused"), "csv"], r"got a list whose item 1 is 'csv' \(str\), not a Logger"),
    ],
)
def test_anything_else_is_refused_with_what_is_accepted(logger, match):
    with pytest.raises(TypeError, match=match):
        resolve_loggers(logger, default_root_dir="unused")


def test_a_custom_logger_needs_only_the_abstract_members():
    with pytest.raises(TypeError, match="abstract"):
        Logger()


MODULES = ["_base", "_versioned", "_hparams", "_tensorboard", "_csv", "_resolve"]


@pytest.mark.parametrize("module", MODULES)
def test_docstring_examples_run(module, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the examples write under ./runs
    results = doctest.testmod(importlib.import_module(f"fitjax.loggers.{module}"))
    assert results.failed == 0 and results.attempted > 0
