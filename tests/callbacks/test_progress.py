"""What the progress bar and the model summary print, captured from their stream."""

from __future__ import annotations

import io
import re

import jax
import numpy as np
from flax import nnx
from helpers import Regressor, quiet_trainer, regression_data
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import fitjax as fj


class Marked(Regressor):
    def loss(self, model, batch):
        pred = model(batch["x"], train=self.training)
        self.log("pred_mean", pred.mean(), prog_bar=True)
        return ((pred - batch["y"]) ** 2).mean(), {"pred": pred}


def _fit_with_bar(**bar_kwargs) -> str:
    out = io.StringIO()
    trainer = quiet_trainer(max_epochs=2, strategy="single", log_every_n_steps=4,
                            callbacks=[fj.RichProgressBar(file=out, **bar_kwargs)], enable_progress_bar=True)
    val = fj.DataLoader(regression_data(n=64, seed=1), batch_size=32)
    trainer.fit(Marked(), fj.DataLoader(regression_data(), batch_size=32), val)  # 8 steps/epoch
    trainer.validate(Marked(), val)
    return out.getvalue()


def test_a_non_terminal_gets_plain_lines_per_log_step_and_per_epoch():
    text = _fit_with_bar()
    assert "\x1b" not in text  # no escape codes in a log file
    lines = text.splitlines()
    steps = [line for line in lines if line.startswith("epoch ")]
    assert [re.match(r"epoch (\d) step (\d)/8 \(global (\d+)\)", s).groups() for s in steps] == [
        ("0", "4", "4"), ("0", "8", "8"), ("1", "4", "12"), ("1", "8", "16")]
    # the loss and the value marked prog_bar=True are shown; the unmarked metric is not
    assert all(" loss " in s and " pred_mean " in s and "mae" not in s for s in steps)
    epochs = [line for line in lines if line.startswith("Epoch ")]
    assert len(epochs) == 2 and all(re.search(r"done in .* loss \S+ .*mae .*val/loss ", e) for e in epochs)
    assert re.search(r"^Validation results  val/loss \S+", text, re.M)


def test_a_terminal_gets_a_live_bar():
    text = _fit_with_bar(force_terminal=True, refresh_rate=2)
    assert "\x1b" in text and "Epoch 1/1" in text and "Validation" in text


def test_refresh_rate_sets_the_plain_line_interval_and_is_checked():
    steps = [line for line in _fit_with_bar(refresh_rate=8).splitlines() if line.startswith("epoch ")]
    assert len(steps) == 2
    try:
        fj.RichProgressBar(refresh_rate=0)
    except ValueError as err:
        assert "refresh_rate" in str(err) and "0" in str(err)
    else:
        raise AssertionError("refresh_rate=0 was accepted")


class NNXNet(nnx.Module):
    def __init__(self):
        self.hidden = nnx.Linear(8, 16, rngs=nnx.Rngs(0))
        self.bn = nnx.BatchNorm(16, rngs=nnx.Rngs(0))
        self.out = nnx.Linear(16, 1, rngs=nnx.Rngs(0))

    def __call__(self, x, train=False):
        return self.out(nnx.relu(self.bn(self.hidden(x))))


class NNXRegressor(Regressor):
    def __init__(self):
        super().__init__()
        self.model = NNXNet()


def test_model_summary_at_fit_start_for_linen_and_nnx():
    for module, trainable, names in [(Regressor(), 8 * 32 + 32 + 32 + 32 + 32 + 1, ["Dense_0", "BatchNorm_0"]),
                                     (NNXRegressor(), 8 * 16 + 16 + 16 + 16 + 16 + 1, ["hidden", "bn", "out"])]:
        out = io.StringIO()
        summary = fj.RichModelSummary(file=out)
        quiet_trainer(max_steps=1, strategy="dp", devices=8, callbacks=[summary], enable_model_summary=True).fit(
            module, fj.DataLoader(regression_data(n=32), batch_size=16))
        text = out.getvalue()
        assert summary.summary.trainable_count == trainable
        assert summary.summary.trainable_bytes == 4 * trainable
        assert summary.summary.other_count > 0  # BatchNorm statistics (and NNX rng counters)
        assert all(name in text for name in names) and "Trainable params" in text
        assert "replicated" in text  # dp over 8 devices: the sharding column is shown


def test_summary_shows_how_sharded_arrays_are_split():
    mesh = Mesh(np.array(jax.devices()), ("data",))
    kernel = jax.device_put(np.zeros((64, 4), np.float32), NamedSharding(mesh, P("data", None)))
    summary = fj.callbacks.summarize({"Dense_0": {"kernel": kernel}}, {})
    (row,) = summary.rows
    assert (row.module, row.name, row.shape, row.count) == ("Dense_0", "kernel", (64, 4), 256)
    assert row.sharding == "(data, -)" and row.nbytes == 1024 and row.device_bytes == 128
    assert fj.callbacks.summarize({"a": {"b": {"w": np.zeros(3)}, "c": np.zeros(2)}}, {}, max_depth=1).rows[0].count == 5


def test_enable_flags_add_or_remove_the_default_callbacks():
    trainer = fj.Trainer(logger=False)
    assert {type(cb) for cb in trainer.callbacks} == {fj.RichProgressBar, fj.RichModelSummary, fj.ModelCheckpoint}
    trainer = fj.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False, callbacks=[fj.RichModelSummary(max_depth=1)])
    assert trainer.callbacks == []
