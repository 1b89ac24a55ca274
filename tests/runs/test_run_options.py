"""`Trainer(runs=...)` with the options the guide says compose: clipping, accumulation,
`steps_per_execution`, a stateful metric, bf16 precision, and a resume from the middle of an
epoch. Each member equals a fit of one run with its seed and hyperparameters; the resume equals
the uninterrupted fit bitwise."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import fitjax as fj
from helpers import assert_trees_close, quiet_trainer
from test_many_runs import Decayed, loader, member
from test_run_checkpoints import plain

RUNS = [{"lr": 0.01, "wd": 0.1, "seed": 3}, {"lr": 0.05, "wd": 0.0, "seed": 4}]


pytestmark = pytest.mark.usefixtures("compile_cache")  # tests/conftest.py


class Metered(Decayed):
    """`Decayed` with a stateful metric: its sums are carried through the epoch."""

    def metrics(self, batch, outputs):
        return {"mae": fj.metrics.MeanAbsoluteError().update(outputs["pred"], batch["y"])}


class Losses(fj.Callback):
    """Each step's loss of each run (a per-step fetch, affordable here)."""

    def __init__(self, runs):
        self.runs, self.losses = runs, []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.losses.append([np.asarray(outputs[f"loss/run_{i}"]).tolist() for i in range(self.runs)])


def _pair(options, *, runs=RUNS, epochs=2, callbacks=(), alone=(0, 1), val=True):
    """A fit of `runs` together (with `callbacks`) and a fit of each run in `alone` by itself, with
    the same options (one device: the runs' equality is not blurred by a split batch's sums)."""
    together = quiet_trainer(max_epochs=epochs, strategy="single", runs=runs, callbacks=list(callbacks), **options)
    together.fit(Metered(), loader(), loader() if val else None)
    singles = {}
    for i in alone:
        run = runs[i]
        trainer = quiet_trainer(max_epochs=epochs, strategy="single", seed=run["seed"], **options)
        trainer.fit(Metered(lr=run["lr"], wd=run["wd"]), loader(), loader() if val else None)
        singles[i] = trainer
    return together, singles


def test_clipping_accumulation_steps_per_execution_and_a_metric_match_each_run_alone():
    # 4 batches an epoch: 2 optimizer steps of 2 micro-batches, both in one execution
    options = dict(gradient_clip_val=0.5, accumulate_grad_batches=2, steps_per_execution=2)
    together, alone = _pair(options)
    assert together.global_step == 4
    for i, single in alone.items():
        # float tolerance, not bitwise: vmapped, each matrix product is one batched product over
        # the runs, summed in another order than the single run's (see test_many_runs; measured
        # here: weights up to 2e-8 apart)
        assert_trees_close(member(together.state.params, i), single.state.params, rtol=1e-5, atol=1e-6)
        assert_trees_close(member(together.state.model_state, i), single.state.model_state, rtol=1e-5, atol=1e-6)
        for key in ("train/loss", "train/mae_epoch", "val/loss", "val/mae"):
            np.testing.assert_allclose(together.callback_metrics[f"{key}/run_{i}"], single.callback_metrics[key],
                                       rtol=1e-5, err_msg=key)
    # the clip acted: without it, each run ends elsewhere
    unclipped = quiet_trainer(max_epochs=2, strategy="single", seed=4, accumulate_grad_batches=2,
                              steps_per_execution=2)
    unclipped.fit(Metered(lr=0.05, wd=0.0), loader())
    assert not np.allclose(member(together.state.params, 1)["Dense_1"]["kernel"],
                           unclipped.state.params["Dense_1"]["kernel"], atol=1e-3)


@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16-true"])
def test_bf16_runs_match_each_run_alone(precision):
    history = Losses(2)
    runs = [{"lr": 0.01, "wd": 0.0, "seed": 3}, {"lr": 0.02, "wd": 0.0, "seed": 4}]
    together, alone = _pair(dict(precision=precision), runs=runs, epochs=3, callbacks=[history], alone=[1], val=False)
    losses = np.asarray(history.losses)  # [steps, runs]
    assert losses.shape == (12, 2) and (losses[-4:].mean(0) < losses[:4].mean(0) / 2).all()  # each run learns
    # one member alone (the first test compares both), to bf16 tolerance: the products run in
    # bfloat16 (8 bits of mantissa) and, batched over the runs, may round in another order than
    # one run's. Measured on XLA:CPU: bf16-mixed equal bitwise (the backend's lowering, not a
    # promise); bf16-true's bfloat16 weights up to one rounding step (0.016) apart.
    single = alone[1]
    assert_trees_close(member(together.state.params, 1), single.state.params, rtol=2e-2, atol=2e-2)
    np.testing.assert_allclose(together.callback_metrics["train/mae_epoch/run_1"],
                               single.callback_metrics["train/mae_epoch"], rtol=2e-2)


def test_every_run_resumes_bitwise_from_the_middle_of_an_epoch(tmp_path):
    # 4 batches an epoch: step 6 is after batch 1 of epoch 1
    def fit(*callbacks, ckpt_path=None, **limits):
        history = Losses(2)
        trainer = quiet_trainer(runs=RUNS, strategy="single", callbacks=[history, *callbacks],
                                enable_checkpointing=bool(callbacks), **limits)
        trainer.fit(Metered(), loader(), loader(), ckpt_path=ckpt_path)
        return trainer, history.losses

    straight, all_losses = fit(max_epochs=2)
    saves = fj.ModelCheckpoint(tmp_path, every_n_train_steps=6, save_top_k=-1)
    stopped, first = fit(saves, max_steps=6)
    assert stopped.global_step == 6 and [p.name for p in tmp_path.iterdir()] == ["epoch=1-step=6"]  # mid-epoch
    resumed, second = fit(max_epochs=2, ckpt_path=tmp_path / "epoch=1-step=6")
    assert resumed.global_step == 8
    assert len(second) == 2 and first + second == all_losses  # each run's loss at each step, bitwise
    for got, want in zip(jax.tree.leaves(plain(resumed.state)), jax.tree.leaves(plain(straight.state))):
        np.testing.assert_array_equal(got, want)
    for key in ("train/mae_epoch/run_0", "train/mae_epoch/run_1", "val/loss/run_0", "val/loss/run_1"):
        assert resumed.callback_metrics[key] == straight.callback_metrics[key], key  # sums across the resume


def test_runs_refuse_a_module_with_weights_to_load_naming_the_call():
    donor = Metered()
    quiet_trainer(max_epochs=1, strategy="single").fit(donor, loader())
    module = Metered()
    module.load_weights(donor.variables[0])  # nested {name: array}: read when the trainer builds
    with pytest.raises(ValueError, match=r"runs=\.\.\.\) with Metered\.load_weights\(\.\.\.\).*own initialisation"):
        quiet_trainer(max_epochs=1, strategy="single", runs=RUNS).fit(module, loader())
