"""Every path argument takes relative and `~` paths; the checkpoints guide's plain-Orbax snippet runs as written."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from helpers import Regressor, quiet_trainer, regression_data

import fitjax as fj

DATA = regression_data(n=64)  # 2 batches of 32 an epoch
GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "checkpoints.md"


pytestmark = pytest.mark.usefixtures("compile_cache")  # tests/conftest.py


def _fit(trainer, **kwargs):
    module = Regressor()
    trainer.fit(module, fj.DataLoader(DATA, batch_size=32), fj.DataLoader(DATA, batch_size=32), **kwargs)
    return module


def test_relative_and_home_paths_everywhere(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))

    # default_root_dir="~/runs": the default checkpoint folder under the home directory
    trainer = quiet_trainer(max_epochs=1, default_root_dir="~/runs", enable_checkpointing=True)
    _fit(trainer)
    saved = tmp_path / "home" / "runs" / "checkpoints" / "epoch=0-step=2"
    assert trainer.checkpoint_callback.last_model_path == str(saved)
    assert fj.checkpoint.is_checkpoint(saved)
    assert not (tmp_path / "~").exists()

    # relative dirpath, then "last" and "best" resolved from another working directory
    ckpt = fj.ModelCheckpoint("runs/ck", monitor="val/loss")
    trainer = quiet_trainer(max_epochs=2, enable_checkpointing=True, callbacks=[ckpt])
    _fit(trainer)
    assert ckpt.best_model_path.startswith(str(tmp_path / "runs" / "ck"))
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    trainer = quiet_trainer(max_epochs=3, enable_checkpointing=True, callbacks=[ckpt])
    _fit(trainer, ckpt_path="last")
    assert trainer.global_step == 6
    assert trainer.validate(Regressor(), fj.DataLoader(DATA, batch_size=32), ckpt_path="best")

    # a relative checkpoint folder and a ~ one, for load_from_checkpoint and ckpt_path
    monkeypatch.chdir(tmp_path)
    best = Path(ckpt.best_model_path).relative_to(tmp_path)
    module = Regressor.load_from_checkpoint(best)
    home = Regressor.load_from_checkpoint("~/runs/checkpoints/epoch=0-step=2")
    assert module.variables is not None and home.variables is not None
    trainer = quiet_trainer(max_epochs=1)
    assert trainer.test(Regressor(), fj.DataLoader(DATA, batch_size=32), ckpt_path=str(best))
    trainer = quiet_trainer(max_epochs=2, enable_checkpointing=True, default_root_dir="~/runs")
    _fit(trainer, ckpt_path="~/runs/checkpoints/epoch=0-step=2")
    assert trainer.global_step == 4


def test_the_checkpoints_guide_orbax_snippet_runs_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    block = re.search(r"read them without fitjax:.*?```python\n(.*?)```", GUIDE.read_text(), re.S)
    assert block, "docs/guides/checkpoints.md lost its plain-Orbax snippet"
    folder = re.search(r'"(checkpoints/[^"]+)/state"', block.group(1)).group(1)
    epochs, steps = (int(n) for n in re.fullmatch(r"checkpoints/epoch=(\d+)-step=(\d+)", folder).groups())
    trainer = quiet_trainer(max_epochs=epochs + 1, enable_checkpointing=True,
                            callbacks=[fj.ModelCheckpoint("checkpoints")])
    data = regression_data(n=32 * steps // (epochs + 1))
    module = Regressor()
    trainer.fit(module, fj.DataLoader(data, batch_size=32))

    scope: dict = {}
    exec(compile(block.group(1), str(GUIDE), "exec"), scope)
    np.testing.assert_array_equal(scope["params"]["Dense_0"]["kernel"],
                                  module.variables[0]["Dense_0"]["kernel"])


def test_a_path_that_is_no_checkpoint_names_what_was_given(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"got 'nowhere' \('.*/nowhere'\), which is not a complete"):
        Regressor.load_from_checkpoint("nowhere")
