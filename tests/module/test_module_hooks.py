"""Every Lightning module hook a `LitModule` defines runs as in Lightning or is refused with why.

The probe defines every host hook of `fitjax.module.hook_table` on a module, runs fit, validate,
test and predict on two batches, and compares the calls (order and arguments) with Lightning 2.6
running the same scenario on a torch `LightningModule` defining the same hooks.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import optax
import pytest
import flax.linen as nn

import fitjax as fj
from fitjax.module import hook_table
from helpers import DenseRegression

torch = pytest.importorskip("torch")
pl = pytest.importorskip("lightning.pytorch")
from lightning.pytorch.core.hooks import CheckpointHooks, DataHooks, ModelHooks  # noqa: E402

# The LightningModule's own hooks the Lightning Trainer calls (beside its hook mixins').
_LIGHTNING_MODULE_HOOKS = ("training_step", "validation_step", "test_step", "predict_step", "forward",
                           "configure_optimizers", "configure_callbacks", "configure_gradient_clipping",
                           "optimizer_step", "optimizer_zero_grad", "lr_scheduler_step", "backward")
# Called where fitjax asks for data or checkpoints (their order is checked by their own tests).
_NOT_PROBED = {"train_dataloader", "val_dataloader", "test_dataloader", "predict_dataloader",
               "on_save_checkpoint", "on_load_checkpoint", "configure_sharded_model"}
_TRANSFER = ("on_before_batch_transfer", "on_after_batch_transfer")
_PROBED = sorted(set(hook_table.HOST_HOOKS) - _NOT_PROBED)


def _lightning_hooks() -> set[str]:
    return {name for mixin in (ModelHooks, DataHooks, CheckpointHooks)
            for name, value in vars(mixin).items() if callable(value) and not name.startswith("_")}


def test_every_lightning_hook_is_called_traced_or_refused():
    tables = (hook_table.HOST_HOOKS, hook_table.TRACED_HOOKS, hook_table.REFUSED_HOOKS)
    assert _lightning_hooks() | set(_LIGHTNING_MODULE_HOOKS) == set().union(*tables)
    assert sum(map(len, tables)) == len(set().union(*tables))  # each in one table only


def _short(value):
    """A call's argument as the comparison sees it: arrays by shape, outputs by kind."""
    if hasattr(value, "shape"):
        return tuple(value.shape)
    if isinstance(value, (list, tuple)):
        return [_short(v) for v in value]
    if isinstance(value, dict):
        return "outputs"
    return str(getattr(value, "value", value))  # Lightning's TrainerFn enum: "fit", "validate", ...


def _recorder(calls: list, name: str, *, torch_side: bool):
    """A hook recording `(name, its arguments)`; Lightning's runs its own body after (the mode
    switches, the batch handed on), fitjax's hands the batch on from the transfer hooks."""
    def hook(self, *args, **kwargs):
        args = (*args, *kwargs.values())
        if name.startswith("on_train_batch_end") and not torch_side:
            assert "loss" in args[0]  # the step's outputs
        shown = ["outputs" if name.endswith("_batch_end") and i == 0 else _short(a) for i, a in enumerate(args)]
        calls.append((name, shown))
        if torch_side:
            return getattr(pl.LightningModule, name)(self, *args)
        return args[0] if name in _TRANSFER else None

    return hook


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 2)).astype(np.float32)
    y = rng.normal(size=(8, 1)).astype(np.float32)
    return x, y


def _lightning_calls() -> list:
    calls: list = []
    x, y = _data()

    def loader():
        return torch.utils.data.DataLoader(list(zip(torch.from_numpy(x), torch.from_numpy(y))), batch_size=4)

    class Torch(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            return ((self.layer(batch[0]) - batch[1]) ** 2).mean()

        def validation_step(self, batch, batch_idx):
            self.log("v", ((self.layer(batch[0]) - batch[1]) ** 2).mean())

        def test_step(self, batch, batch_idx):
            self.log("t", ((self.layer(batch[0]) - batch[1]) ** 2).mean())

        def predict_step(self, batch, batch_idx):
            return self.layer(batch[0])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), 0.1)

        train_dataloader = val_dataloader = test_dataloader = predict_dataloader = staticmethod(loader)

    for name in _PROBED:
        setattr(Torch, name, _recorder(calls, name, torch_side=True))
    module = Torch()
    trainer = pl.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu", devices=1)
    for stage in ("fit", "validate", "test", "predict"):
        calls.append((f"-- {stage}", []))
        getattr(trainer, stage)(module)
    return calls


def _fitjax_calls() -> list:
    calls: list = []
    x, y = _data()
    batches = [(x[:4], y[:4]), (x[4:], y[4:])]

    class Module(fj.LitModule):
        def __init__(self):
            super().__init__()
            self.model = nn.Dense(1)

        def training_step(self, batch, batch_idx):
            return ((self.model(batch[0]) - batch[1]) ** 2).mean()

        def validation_step(self, batch, batch_idx):
            self.log("v", ((self.model(batch[0]) - batch[1]) ** 2).mean())

        def test_step(self, batch, batch_idx):
            self.log("t", ((self.model(batch[0]) - batch[1]) ** 2).mean())

        def predict_step(self, batch, batch_idx):
            return self.model(batch[0])

        def configure_optimizers(self):
            return optax.sgd(0.1)

    for name in _PROBED:
        setattr(Module, name, _recorder(calls, name, torch_side=False))
    module = Module()
    trainer = fj.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, devices=1)
    for stage in ("fit", "validate", "test", "predict"):
        calls.append((f"-- {stage}", []))
        data = (batches, batches) if stage == "fit" else (batches,)
        getattr(trainer, stage)(module, *data)
    return calls


def test_module_hooks_run_in_lightnings_order_with_its_arguments():
    expected = _lightning_calls()
    got = _fitjax_calls()
    # The one difference, documented: fit builds its step from the first train batch, so that
    # batch is drawn (through the transfer hooks) before `on_fit_start`, right after
    # `configure_model`; Lightning draws it right before `on_train_batch_start(batch, 0)`.
    first = [i for i, (name, _) in enumerate(got) if name in _TRANSFER][:2]
    assert [got[i - 1][0] for i in first[:1]] == ["configure_model"]
    drawn = [got.pop(first[1]), got.pop(first[0])][::-1]
    at = next(i for i, call in enumerate(got) if call == ("on_train_batch_start", [[(4, 2), (4, 1)], "0"]))
    got[at:at] = drawn
    assert [name for name, _ in got] == [name for name, _ in expected]
    assert got == expected


def _regression_batches(n=4):
    rng = np.random.default_rng(1)
    return [{"x": rng.normal(size=(4, 2)).astype(np.float32), "y": rng.normal(size=(4, 1)).astype(np.float32)}
            for _ in range(n)]


_Regression = DenseRegression  # the smallest module (tests/helpers.py)


def _trainer(**kwargs):
    return fj.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, devices=1, **kwargs)


@pytest.mark.parametrize("hook", sorted(hook_table.REFUSED_HOOKS))
def test_a_refused_hook_fails_at_fit_start_saying_why_and_what_to_do(hook):
    Module = type("Module", (_Regression,), {hook: lambda self, *args: None})
    with pytest.raises(TypeError) as info:
        _trainer(max_steps=1).fit(Module(), _regression_batches())
    message = str(info.value)
    assert f"Module.{hook}: " in message and hook_table.REFUSED_HOOKS[hook] in message
    assert "on_train_batch_start" in message  # where host work per step goes


def test_train_batch_hooks_log_and_minus_one_skips_the_rest_of_the_epoch():
    seen = []

    class Module(_Regression):
        def on_train_batch_start(self, batch, batch_idx):
            seen.append((self.trainer.current_epoch, batch_idx))
            return -1 if batch_idx == 2 else None  # Lightning's: the epoch ends here

        def on_train_batch_end(self, outputs, batch, batch_idx):
            self.log("host_batch", float(batch["x"][0, 0]))

    trainer = _trainer(max_epochs=2, log_every_n_steps=1)
    trainer.fit(Module(), _regression_batches())
    assert seen == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert trainer.global_step == 4
    assert trainer.callback_metrics["host_batch"] == pytest.approx(float(_regression_batches()[1]["x"][0, 0]))


def test_transfer_hooks_change_the_batch_the_step_sees():
    class Module(_Regression):
        def on_before_batch_transfer(self, batch, dataloader_idx):
            return {"x": batch["x"], "y": np.zeros_like(batch["y"])}  # a host-side target rewrite

        def on_after_batch_transfer(self, batch, dataloader_idx):
            return {**batch, "x": batch["x"] * 2}

    module = Module()
    trainer = _trainer(max_epochs=1, num_sanity_val_steps=0)
    trainer.fit(module, _regression_batches(), _regression_batches(2))
    params, _ = module.variables
    x = np.concatenate([b["x"] for b in _regression_batches(2)]) * 2
    expected = np.mean(np.asarray(nn.Dense(1).apply({"params": params}, x)) ** 2)  # against zeros
    assert trainer.callback_metrics["val/loss"] == pytest.approx(expected, rel=1e-5)


def test_the_porting_guide_says_what_happens_to_every_hook():
    guide = (Path(__file__).resolve().parents[2] / "docs" / "porting.md").read_text()
    section = guide.split("## Module hooks", 1)[1].split("\n## ", 1)[0]
    rows = {row: _names(row.split(" | ")[0]) for row in section.splitlines() if row.startswith("| `")}
    for hook in set(hook_table.HOST_HOOKS) | set(hook_table.TRACED_HOOKS) | set(hook_table.REFUSED_HOOKS):
        named = [row for row, names in rows.items() if hook in names]
        assert len(named) == 1, f"docs/porting.md's hook table names {hook} in {len(named)} rows"
        assert ("**refused**" in named[0]) == (hook in hook_table.REFUSED_HOOKS), hook


def _names(cell: str) -> set[str]:
    """The hooks a table cell names: `on_fit_start/_end` names on_fit_start and on_fit_end."""
    names = set()
    for token in re.findall(r"`([^`]+)`", cell):
        head, *alternatives = token.split("(")[0].split("/")
        names.add(head)
        names.update(head.rsplit("_", 1)[0] + alternative for alternative in alternatives)
    return names
