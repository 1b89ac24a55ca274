"""`load_from_checkpoint(path, **overrides)`: overrides that keep the model's shapes load the
saved weights; ones that change them are an error naming every array that differs (issue 33)."""

from __future__ import annotations

import flax.linen as nn
import numpy as np
import optax
import pytest
from helpers import persistent_compile_cache, quiet_trainer

import fitjax as fj

DATA = {"x": np.linspace(-1, 1, 128, dtype=np.float32).reshape(32, 4), "y": np.ones((32, 1), np.float32)}


@pytest.fixture(autouse=True)
def _compile_once(tmp_path):
    """The validations compile the same programs: XLA's persistent cache compiles them once."""
    with persistent_compile_cache(tmp_path / "xla_cache"):
        yield


class Wide(fj.LitModule):
    def __init__(self, hidden: int = 8, lr: float = 0.1):
        super().__init__()
        self.save_hyperparameters()
        self.model = nn.Sequential([nn.Dense(hidden), nn.relu, nn.Dense(1)])

    def loss(self, model, batch):
        return ((model(batch["x"]) - batch["y"]) ** 2).mean()

    def configure_optimizer(self):
        return optax.sgd(self.hparams.lr)


def test_overrides_keep_the_weights_and_shape_changes_name_every_array(tmp_path):
    ckpt = fj.ModelCheckpoint(tmp_path)
    quiet_trainer(max_epochs=1, enable_checkpointing=True, callbacks=[ckpt]).fit(
        Wide(), fj.DataLoader(DATA, batch_size=16))
    val = lambda module: quiet_trainer().validate(module, fj.DataLoader(DATA, batch_size=16))[0]["val/loss"]
    saved = Wide.load_from_checkpoint(ckpt.last_model_path)
    same = Wide.load_from_checkpoint(ckpt.last_model_path, lr=0.5)  # shapes unchanged
    assert same.hparams.lr == 0.5 and same.variables is not None
    assert val(same) == val(saved)  # the saved weights, not fresh ones

    wider = Wide.load_from_checkpoint(ckpt.last_model_path, hidden=16)  # a Linen model: checked at its build
    with pytest.raises(ValueError, match=(
            r"Wide.load_from_checkpoint\('.*epoch=0-step=2', hidden=16\) builds a model the checkpoint's "
            r"weights do not fit \(hidden: 8 -> 16\):\n"
            r"  layers_0.bias: shape \(8,\) in the checkpoint, \(16,\) in the model\n"
            r"  layers_0.kernel: shape \(4, 8\) in the checkpoint, \(4, 16\) in the model\n"
            r"  layers_2.kernel: shape \(8, 1\) in the checkpoint, \(16, 1\) in the model\n"
            r"Load it without the hyperparameters that change the model's shapes")):
        val(wider)
