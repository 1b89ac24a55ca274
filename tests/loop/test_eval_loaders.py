"""Several validation and test loaders, as Lightning 2.6 runs them.

The expected values are what Lightning 2.6.6 gives for the same scenario, run on CPU with
`lightning.pytorch` in a scratch venv: a `torch.nn.Linear(4, 1)` with zeroed weight and bias
(SGD lr=0, so it stays zero: each loss is the data's mean of y**2), `training_step` the MSE,
`validation_step(batch, batch_idx, dataloader_idx=0)` logging `val_loss` (prog_bar) and, for
loader 1 only, `only_b` (the mean absolute error), `test_step` logging `test_loss`,
`on_validation_epoch_end` logging `ep_end=1.0`; `fit(m, train(8), [val(10), val(6)])` with batch
size 4, `num_sanity_val_steps=1`, `max_epochs=3`, `ModelCheckpoint(monitor=
"val_loss/dataloader_idx_1")`, `EarlyStopping(monitor="val_loss/dataloader_idx_1", patience=0)`;
then `validate(m, [val_a, val_b])`, `validate(m, [val_a])`, `test(m, {"a": val_a, "b": val_b})`.
The data is `_data(n, seed)` below (the same numpy arrays went into torch tensors).
"""

from __future__ import annotations

import io
import re

import flax.linen as nn
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import count_compiles, quiet_trainer

import fitjax as fj

# the zero model is the point: its weights are "freshly initialised" on purpose
pytestmark = pytest.mark.filterwarnings("ignore:.*was never fitted:UserWarning")

# Lightning 2.6.6's numbers (see the module docstring)
VAL_A, VAL_B, ONLY_B = 6.162890434265137, 5.6309380531311035, 1.858817219734192
# hooks seen: ("start", sanity_checking, num_val_batches), ("batch", batch_idx, dataloader_idx), ("end",)
LIGHTNING_HOOKS = [("batch", 0, 0), ("batch", 0, 1), ("end",),  # the sanity check: 1 batch of each loader
                   *[("start", False, [3, 2]), ("batch", 0, 0), ("batch", 1, 0), ("batch", 2, 0),
                     ("batch", 0, 1), ("batch", 1, 1), ("end",)] * 2]


def _data(n, seed, batch_size=4):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4)).astype(np.float32)
    return fj.DataLoader({"x": x, "y": (x.sum(1, keepdims=True) + 1).astype(np.float32)}, batch_size=batch_size)


def _vals():
    return [_data(10, 1), _data(6, 2)]


class LitTwoLoaders(fj.LitModule):
    def __init__(self):
        super().__init__()
        self.model = nn.Dense(1, kernel_init=nn.initializers.zeros)

    def training_step(self, batch, batch_idx):
        return ((self.model(batch["x"]) - batch["y"]) ** 2).mean()

    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        error = self.model(batch["x"]) - batch["y"]
        self.log("val_loss", (error ** 2).mean(), prog_bar=True)
        if dataloader_idx == 1:  # a Python int, as in Lightning
            self.log("only_b", jnp.abs(error).mean())

    def test_step(self, batch, batch_idx, dataloader_idx=0):
        self.log("test_loss", ((self.model(batch["x"]) - batch["y"]) ** 2).mean())

    def on_validation_epoch_end(self):
        self.log("ep_end", 1.0)

    def configure_optimizers(self):
        return optax.sgd(0.0)


class Hooks(fj.Callback):
    def __init__(self):
        self.seen = []

    def on_validation_start(self, trainer, module):
        self.seen.append(("start", trainer.sanity_checking, list(trainer.num_val_batches)))

    def on_validation_batch_start(self, trainer, module, batch, batch_idx, *dataloader_idx):
        self.seen.append(("batch_start", batch_idx, *dataloader_idx))

    def on_validation_batch_end(self, trainer, module, outputs, batch, batch_idx, *dataloader_idx):
        assert self.seen[-1] == ("batch_start", batch_idx, *dataloader_idx)  # Lightning: the same arguments
        self.seen[-1] = ("batch", batch_idx, *dataloader_idx)

    def on_validation_end(self, trainer, module):
        self.seen.append(("end",))


@pytest.mark.parametrize("strategy, devices", [("single", 1), ("dp", 2), ("fsdp", 4)])
def test_fit_with_two_val_loaders_logs_checkpoints_and_stops_as_lightning(tmp_path, strategy, devices):
    hooks = Hooks()
    checkpoint = fj.ModelCheckpoint(dirpath=tmp_path, monitor="val_loss/dataloader_idx_1", mode="min")
    stopping = fj.EarlyStopping(monitor="val_loss/dataloader_idx_1", patience=0)
    trainer = quiet_trainer(max_epochs=3, num_sanity_val_steps=1, strategy=strategy, devices=devices,
                            callbacks=[hooks, checkpoint, stopping], enable_checkpointing=True)
    trainer.fit(LitTwoLoaders(), _data(8, 0), _vals())
    # the sanity check: fitjax counts its batches in num_val_batches (Lightning: num_sanity_val_batches)
    assert hooks.seen[0] == ("start", True, [1, 1])
    assert hooks.seen[1:] == LIGHTNING_HOOKS
    metrics = {"val_loss/dataloader_idx_0": VAL_A, "val_loss/dataloader_idx_1": VAL_B,
               "only_b/dataloader_idx_1": ONLY_B, "ep_end": 1.0}
    assert {k: trainer.callback_metrics[k] for k in metrics} == pytest.approx(metrics, rel=1e-6)
    assert trainer.progress_bar_metrics == pytest.approx(
        {"val_loss/dataloader_idx_0": VAL_A, "val_loss/dataloader_idx_1": VAL_B}, rel=1e-6)
    # Lightning: best epoch=0-step=2 at 5.6309, stopped_epoch 1, current_epoch 2, global_step 4
    assert checkpoint.best_model_score == pytest.approx(VAL_B, rel=1e-6)
    assert "epoch=0-step=2" in str(checkpoint.best_model_path)
    assert (stopping.stopped_epoch, trainer.current_epoch, trainer.global_step) == (1, 2, 4)


def test_validate_and_test_return_one_dict_per_loader_as_lightning():
    trainer = quiet_trainer(max_epochs=1, strategy="single")
    module = LitTwoLoaders()
    trainer.fit(module, _data(8, 0))
    results = trainer.validate(module, _vals())
    assert results == [pytest.approx({"val_loss/dataloader_idx_0": VAL_A, "ep_end": 1.0}, rel=1e-6),
                       pytest.approx({"val_loss/dataloader_idx_1": VAL_B, "only_b/dataloader_idx_1": ONLY_B,
                                      "ep_end": 1.0}, rel=1e-6)]
    # one loader in a list: no suffix (Lightning: [{'val_loss': 6.1629, 'ep_end': 1.0}])
    assert trainer.validate(module, [_data(10, 1)]) == [pytest.approx({"val_loss": VAL_A, "ep_end": 1.0}, rel=1e-6)]
    # a dict of loaders: indices in the dict's order
    assert trainer.test(module, dict(zip("ab", _vals()))) == [
        pytest.approx({"test_loss/dataloader_idx_0": VAL_A}, rel=1e-6),
        pytest.approx({"test_loss/dataloader_idx_1": VAL_B}, rel=1e-6)]


def test_lightning_signature_errors():
    class NoIndex(LitTwoLoaders):
        def validation_step(self, batch, batch_idx):
            return None

    class Required(LitTwoLoaders):
        def validation_step(self, batch, batch_idx, dataloader_idx):
            return None

    # Lightning: "You provided multiple `val_dataloader`, but no `dataloader_idx` argument in
    # `NoIdx.validation_step()`. Try adding `dataloader_idx=0` to its signature."
    with pytest.raises(RuntimeError, match=r"several validation loaders.*NoIndex.validation_step.*dataloader_idx=0"):
        quiet_trainer().validate(NoIndex(), _vals())
    with pytest.raises(RuntimeError, match=r"several validation loaders"):
        quiet_trainer(max_epochs=1, strategy="single").fit(NoIndex(), _data(8, 0), _vals())
    # Lightning: "You provided only a single `val_dataloader`, but have included `dataloader_idx`
    # in `Required.validation_step()`. Either remove the argument or give it a default value ..."
    with pytest.raises(RuntimeError, match=r"one validation loader.*Required.validation_step.*dataloader_idx=0"):
        quiet_trainer().validate(Required(), _data(10, 1))


class Regression(fj.LitModule):
    """fitjax's own shape: `loss` and `metrics`, the same zero model and MSE."""

    def __init__(self, per_loader=False):
        super().__init__()
        self.model = nn.Dense(1, kernel_init=nn.initializers.zeros)
        self.per_loader = per_loader

    def loss(self, model, batch):
        error = model(batch["x"]) - batch["y"]
        return (error ** 2).mean(), error

    def metrics(self, batch, error):
        if self.per_loader and self.dataloader_idx == 1:  # a Python int while traced
            return {"mae": jnp.abs(error).mean()}
        return {}

    def configure_optimizer(self):
        return optax.sgd(0.0)


@pytest.mark.parametrize("strategy", ["dp", "fsdp"])
def test_a_fitjax_module_gets_suffixed_keys_equal_on_every_strategy(strategy):
    trainer = quiet_trainer(strategy=strategy, devices=8)
    module = Regression()
    with count_compiles() as compiles:
        results = trainer.validate(module, _vals())
    assert compiles["eval_step"] == 1  # one program serves both loaders: the module ignores the index
    assert results == [pytest.approx({"val/loss/dataloader_idx_0": VAL_A}, rel=1e-6),
                       pytest.approx({"val/loss/dataloader_idx_1": VAL_B}, rel=1e-6)]
    with count_compiles() as compiles:
        per_loader = trainer.validate(Regression(per_loader=True), _vals())
    assert compiles["eval_step"] == 2  # it reads `self.dataloader_idx`: a program per loader
    assert per_loader[1] == pytest.approx({"val/loss/dataloader_idx_1": VAL_B, "val/mae/dataloader_idx_1": ONLY_B},
                                          rel=1e-6)
    (single,) = trainer.validate(module, _data(10, 1))
    assert single == pytest.approx({"val/loss": VAL_A}, rel=1e-6)


def test_the_progress_bar_prints_a_results_line_per_loader():
    out = io.StringIO()
    trainer = quiet_trainer(max_epochs=1, strategy="single", enable_progress_bar=True, callbacks=[fj.RichProgressBar(file=out)])
    module = LitTwoLoaders()
    trainer.fit(module, _data(8, 0))
    trainer.validate(module, _vals())
    lines = [line for line in out.getvalue().splitlines() if "results" in line]
    # a live bar (a terminal) draws a bar per loader: loader 1's total is its own 2 batches
    live = io.StringIO()
    bar = fj.RichProgressBar(file=live, force_terminal=True, console_kwargs={"width": 100})
    quiet_trainer(strategy="single", enable_progress_bar=True, callbacks=[bar]).validate(module, _vals())
    drawn = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", live.getvalue())
    assert re.search(r"Validation .*\d/3", drawn) and re.search(r"Validation .*\d/2", drawn), drawn
    # Lightning's table: a column per loader, rows named without the suffix
    assert lines == ["Validation results (DataLoader 0)  val_loss 6.163  ep_end 1",
                     "Validation results (DataLoader 1)  only_b 1.859  val_loss 5.631  ep_end 1"]


def test_a_list_of_batches_stays_one_loader():
    batches = [{"x": np.ones((4, 4), np.float32), "y": np.ones((4, 1), np.float32)}] * 3
    assert len(fj.data.as_loaders(batches, name="val_data")) == 1
    assert len(fj.data.as_loaders([batches, batches[:1]], name="val_data")) == 2
    (result,) = quiet_trainer(strategy="single").validate(Regression(), batches)
    assert result == pytest.approx({"val/loss": 1.0})
