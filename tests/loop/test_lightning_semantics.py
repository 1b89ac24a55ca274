"""The loop's schedule, as Lightning's own test-suite pins it.

Each expected value below is what Lightning 2.6 gives for the same scenario (a script ran it on
`lightning.pytorch` with a BoringModel-sized module; its numbers are copied here), and each test
names the Lightning test that asserts the same fact. Positions are `(epoch, batches done in the
epoch, global step)` at `on_validation_start`, sanity check excluded.
"""

from __future__ import annotations

import csv

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import MLP, Regressor, quiet_trainer, regression_data

import fitjax as fj

# the same small programs, fit after fit: compiled once (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("compile_cache")


class Recorder(fj.Callback):
    """What the hooks saw: validations (sanity check apart), which hooks ran, saves."""

    def __init__(self):
        self.vals, self.sanity, self.hooks, self.saved = [], 0, [], set()

    def on_fit_start(self, trainer, module):
        self.hooks.append("on_fit_start")

    def on_train_start(self, trainer, module):
        self.hooks.append("on_train_start")

    def on_validation_start(self, trainer, module):
        if trainer.sanity_checking:
            self.sanity += 1
        else:
            p = trainer.progress
            self.vals.append((p.epoch, p.batches_done, p.global_step))

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if trainer.progress.last_saved is not None:
            self.saved.add(trainer.progress.last_saved.step)


def _fit(batches, val=True, *, batch_size=4, **kwargs):
    recorder = Recorder()
    kwargs.setdefault("strategy", "single")
    trainer = quiet_trainer(callbacks=[recorder, *kwargs.pop("callbacks", [])], **kwargs)
    train = fj.DataLoader(regression_data(n=batches * batch_size), batch_size=batch_size)
    val_data = fj.DataLoader(regression_data(n=8, seed=1), batch_size=4) if val else None
    trainer.fit(Regressor(batchnorm=False), train, val_data)
    return trainer, recorder


@pytest.mark.parametrize(
    "batches, kwargs, vals, global_step, epoch",
    [
        # test_val_check_interval.py::test_val_check_interval_with_check_val_every_n_epoch_none
        # style: an int interval counts batches over the whole run
        (4, dict(max_epochs=3, val_check_interval=3, check_val_every_n_epoch=None),
         [(0, 3, 3), (1, 2, 6), (2, 1, 9), (2, 4, 12)], 12, 3),
        # test_val_check_interval.py::test_val_check_interval (denominator 3): 1/3 of 64 is
        # every 21 batches; no validation at batch 64
        (64, dict(max_epochs=2, val_check_interval=1 / 3),
         [(0, 21, 21), (0, 42, 42), (0, 63, 63), (1, 21, 85), (1, 42, 106), (1, 63, 127)], 128, 2),
        # test_trainer.py::test_check_val_every_n_epoch
        (4, dict(max_epochs=4, check_val_every_n_epoch=2), [(1, 4, 8), (3, 4, 16)], 16, 4),
        # test_trainer.py::test_trainer_max_steps_and_epochs: max_steps mid-epoch, no validation
        (8, dict(max_steps=5), [], 5, 1),
        # test_trainer.py::test_trainer_max_steps_and_epochs_validation (-1: no limit)
        (4, dict(max_epochs=-1, max_steps=10), [(0, 4, 4), (1, 4, 8)], 10, 3),
        (4, dict(max_epochs=2, max_steps=-1), [(0, 4, 4), (1, 4, 8)], 8, 2),
    ],
)
def test_validation_runs_where_lightning_runs_it(batches, kwargs, vals, global_step, epoch):
    """Lightning's tests named in each case; `trainer.current_epoch` counts the finished ones."""
    trainer, recorder = _fit(batches, **kwargs)
    assert recorder.vals == vals
    assert (trainer.global_step, trainer.current_epoch, recorder.sanity) == (global_step, epoch, 1)


def test_validation_with_accumulation_runs_at_the_next_optimizer_step():
    """Lightning (test_val_check_interval.py counts; loops/test_training_loop.py) validates after
    batches 3 and 6 of 8 with val_check_interval=3 and accumulate_grad_batches=2, at global steps
    1 and 3. fitjax steps two batches at a time (one jitted step): the same two validations, each
    at the end of the optimizer step that holds the batch (docs/porting.md)."""
    trainer, recorder = _fit(8, max_epochs=1, val_check_interval=3, accumulate_grad_batches=2)
    assert recorder.vals == [(0, 4, 2), (0, 6, 3)]
    assert trainer.global_step == 4


@pytest.mark.parametrize("kwargs", [dict(max_steps=0), dict(max_epochs=0), dict(max_epochs=2, limit_train_batches=0)])
def test_nothing_to_train_still_fits_without_training(kwargs):
    """test_trainer.py::test_disabled_training / loops' `FitLoop.skip`: max_steps=0, max_epochs=0
    or limit_train_batches=0 run on_fit_start and the sanity check, never on_train_start."""
    trainer, recorder = _fit(4, **kwargs)
    assert (trainer.global_step, trainer.current_epoch, recorder.vals, recorder.sanity) == (0, 0, [], 1)
    assert recorder.hooks == ["on_fit_start"]


def test_limit_val_batches_zero_calls_no_validation_hook():
    """test_trainer.py::test_disabled_validation: limit_val_batches=0, no validation at all."""
    trainer, recorder = _fit(4, max_epochs=2, limit_val_batches=0)
    assert (recorder.vals, recorder.sanity, trainer.global_step) == ([], 0, 8)


def test_lightning_raises_where_fitjax_raises():
    """test_val_check_interval.py::test_invalid_val_check_interval (int above the epoch) and
    ::test_val_check_interval_float_with_none_check_val_every_n_epoch."""
    with pytest.raises(ValueError, match=r"val_check_interval=10\) must be at most the number of train batches "
                                         r"per epoch \(4\).*check_val_every_n_epoch=None"):
        _fit(4, max_epochs=1, val_check_interval=10)
    with pytest.raises(ValueError, match=r"val_check_interval=0.5\) must be an int .* check_val_every_n_epoch=None"):
        fj.Trainer(val_check_interval=0.5, check_val_every_n_epoch=None, logger=False)
    with pytest.raises(ValueError, match=r"max_steps=\.\.\.\) must be an int >= 0, -1 \(no limit\) or None, got -2"):
        fj.Trainer(max_steps=-2, logger=False)


def test_fast_dev_run_validates_and_never_stops_early():
    """test_trainer.py::test_trainer_fast_dev_run (Lightning forces check_val_every_n_epoch=1, no
    sanity check) and callbacks/test_early_stopping.py: EarlyStopping does not check."""
    stopper = fj.EarlyStopping("val/loss", mode="max", patience=0)
    trainer, recorder = _fit(8, fast_dev_run=2, check_val_every_n_epoch=2, callbacks=[stopper])
    assert (recorder.vals, recorder.sanity, trainer.global_step) == ([(0, 2, 2)], 0, 2)
    assert (stopper.stopped_epoch, stopper.wait_count) == (0, 0)


def test_min_epochs_beats_an_early_stop():
    """callbacks/test_early_stopping.py::test_min_epochs_min_steps_global_step: a stop asked at
    every epoch end waits for min_epochs=3."""
    always = fj.EarlyStopping("train/loss_epoch", stopping_threshold=1e9)  # stop at every check
    trainer, recorder = _fit(4, max_epochs=10, min_epochs=3, callbacks=[always])
    assert (trainer.global_step, trainer.current_epoch, always.stopped_epoch) == (12, 3, 2)
    assert recorder.vals == [(0, 4, 4), (1, 4, 8), (2, 4, 12)]


def test_min_steps_beats_an_early_stop_which_leaves_the_epoch_open():
    """test_early_stopping.py::test_min_epochs_min_steps_global_step with min_steps=6: the stop
    asked at the end of epoch 0 takes effect at step 6, mid-epoch. Lightning validates there
    and ends the epoch (its `current_epoch` 2, validations [(0, 4, 4), (1, 2, 6)], and the check
    at that epoch end sets `stopped_epoch` 1); fitjax leaves the epoch's validation and end to
    the fit that resumes it (docs/porting.md, "A stop between two batches"), so the stopped
    epoch is still the current one and `stopped_epoch` the epoch whose check asked to stop."""
    always = fj.EarlyStopping("train/loss_epoch", stopping_threshold=1e9)
    trainer, recorder = _fit(4, max_epochs=10, min_steps=6, callbacks=[always])
    assert (trainer.global_step, trainer.current_epoch, always.stopped_epoch) == (6, 1, 0)
    assert recorder.vals == [(0, 4, 4)]


def test_several_steps_per_call_save_at_the_first_step_after_each_multiple(tmp_path):
    """checkpointing/test_model_checkpoint.py::test_model_checkpoint_every_n_train_steps with
    Lightning's one step per call saves at every multiple of 10; with 8 steps per call the
    multiples 10, 20, ..., 80 are crossed by the calls ending at 16, 24, 32, 40, 56, 64, 72, 80
    (`trainer.progress.crossed(10)`), not only at 40 and 80."""
    saves = fj.ModelCheckpoint(tmp_path, every_n_train_steps=10, save_top_k=-1)
    trainer, recorder = _fit(80, False, max_epochs=1, steps_per_execution=8, callbacks=[saves],
                             enable_checkpointing=True)
    assert sorted(recorder.saved) == [16, 24, 32, 40, 56, 64, 72]  # seen at the next batch's start
    assert trainer.progress.last_saved.step == 80  # the last call's save, after the epoch's end
    with pytest.raises(AttributeError, match="read-only"):  # callbacks read the loop's position only
        trainer.progress.global_step = 3
    with pytest.raises(AttributeError, match=r"^Trainer\.global_step is read-only: the loop sets it"):
        trainer.global_step = 3
    assert trainer.progress.state_dict()["global_step"] == 80  # plain data, as checkpoints store it


class LitLogs(fj.LitModule):
    """Lightning-style logging: a value on step and epoch, and `self.log` in host-side hooks."""

    def __init__(self):
        super().__init__()
        self.model = MLP(batchnorm=False)

    def training_step(self, batch, batch_idx):
        loss = ((self.model(batch["x"], train=True) - batch["y"]) ** 2).mean()
        self.log("a", loss, on_step=True, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("v", ((self.model(batch["x"], train=False) - batch["y"]) ** 2).mean(), on_step=True, on_epoch=True)

    def on_train_epoch_end(self):
        self.log("host_epoch", 1.0 + self.current_epoch_seen)

    def on_train_epoch_start(self):
        self.current_epoch_seen = getattr(self, "current_epoch_seen", -1) + 1

    def on_validation_epoch_end(self):
        self.log("host_val", jnp.float32(5.0))

    def configure_optimizers(self):
        return optax.inject_hyperparams(optax.sgd)(learning_rate=0.01)


def test_rows_and_callback_metrics_of_a_lightning_style_module(tmp_path):
    """trainer/logging_/test_train_loop_logging.py::test__training_step__log and
    test_logger_connector.py: rows of `log_every_n_steps=4` at steps 3, 7, 11, 15 (no partial row
    at an epoch's end), epoch means and validation at each epoch's last step (7, 15),
    `callback_metrics` with the plain name of an on_step+on_epoch value, host-hook values and
    the LearningRateMonitor's value. Lightning's rows for the same run:
    a_step 3 7 11 15; a_epoch, host_epoch, v_epoch, host_val 7 15."""
    trainer = quiet_trainer(max_epochs=2, strategy="single", log_every_n_steps=4,
                            logger=fj.CSVLogger(tmp_path, name="csv"), callbacks=[fj.LearningRateMonitor()])
    trainer.fit(LitLogs(), fj.DataLoader(regression_data(n=64), batch_size=8),
                fj.DataLoader(regression_data(n=16, seed=1), batch_size=8))
    with open(tmp_path / "csv" / "version_0" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    steps = {key: [int(r["step"]) for r in rows if r.get(key)] for key in rows[0]}
    assert steps["a_step"] == steps["lr"] == [3, 7, 11, 15]
    assert steps["a_epoch"] == steps["host_epoch"] == steps["v_epoch"] == steps["host_val"] == [7, 15]
    assert [float(r["host_epoch"]) for r in rows if r["host_epoch"]] == [1.0, 2.0]
    metrics = trainer.callback_metrics
    assert {"a", "a_step", "a_epoch", "v", "v_epoch", "host_epoch", "host_val", "lr"} <= set(metrics)
    assert metrics["a"] == metrics["a_epoch"] and metrics["v"] == metrics["v_epoch"]
    assert "a" not in trainer.logged_metrics and metrics["lr"] == pytest.approx(0.01)
    assert isinstance(trainer.log_dir, str) and trainer.log_dir.endswith("version_0")


class Scheduled(Regressor):
    """Reads `self.trainer.estimated_stepping_batches` in `configure_optimizer`, as Lightning
    projects size their schedules."""

    def configure_optimizer(self):
        self.total_steps = self.trainer.estimated_stepping_batches
        return optax.sgd(optax.linear_schedule(0.05, 0.0, self.total_steps))


@pytest.mark.parametrize("accumulate, expected", [(1, 20), (3, 8)])
def test_estimated_stepping_batches(accumulate, expected):
    """trainer/properties/test_estimated_stepping_batches.py::test_num_stepping_batches_basic and
    ::test_num_stepping_batches_accumulate_gradients: 10 batches (limit_train_batches=10 of 20) x 2
    epochs = 20 steps, ceil(10 / 3) x 2 = 8 with accumulate_grad_batches=3; the fit takes them all."""
    trainer = quiet_trainer(max_epochs=2, limit_train_batches=10, accumulate_grad_batches=accumulate,
                            strategy="single")
    module = Scheduled(batchnorm=False)
    trainer.fit(module, fj.DataLoader(regression_data(n=40), batch_size=2))
    assert module.total_steps == trainer.estimated_stepping_batches == trainer.global_step == expected


def test_estimated_stepping_batches_without_data():
    """::test_num_stepping_batches_with_max_steps (7) and ::test_num_stepping_batches_infinite_training
    (inf); before fit knows the data, the epoch-bound estimate is an error saying when it is known."""
    assert fj.Trainer(max_steps=7, max_epochs=-1, logger=False).estimated_stepping_batches == 7
    assert fj.Trainer(max_epochs=-1, logger=False).estimated_stepping_batches == float("inf")
    with pytest.raises(RuntimeError, match="known once Trainer.fit has its train data"):
        fj.Trainer(max_epochs=2, logger=False).estimated_stepping_batches


def test_save_checkpoint_then_resume_exactly(tmp_path):
    """checkpointing/test_trainer_checkpoint.py::test_finetuning_with_ckpt_path style:
    `trainer.save_checkpoint(path)` after fit, then `fit(ckpt_path=path)` continues at step 8 of
    16 with the same numbers as one uninterrupted run."""
    data = fj.DataLoader(regression_data(n=32), batch_size=4)  # 8 batches
    first = quiet_trainer(max_epochs=1, strategy="single")
    first.fit(Regressor(batchnorm=False), data)
    first.save_checkpoint(tmp_path / "manual")
    meta = fj.checkpoint.read_meta(tmp_path / "manual")
    assert (meta["global_step"], meta["epoch"], meta["progress"]["last_saved"]) == (8, 1, [1, 0, 8])
    with pytest.raises(FileExistsError, match="manual' exists"):
        first.save_checkpoint(tmp_path / "manual")

    resumed = quiet_trainer(max_epochs=2, strategy="single")
    resumed.fit(Regressor(batchnorm=False), data, ckpt_path=tmp_path / "manual")
    whole = quiet_trainer(max_epochs=2, strategy="single")
    whole.fit(Regressor(batchnorm=False), data)
    assert (resumed.global_step, resumed.current_epoch) == (16, 2)
    np.testing.assert_allclose(np.asarray(resumed.state.params["Dense_0"]["kernel"]),
                               np.asarray(whole.state.params["Dense_0"]["kernel"]), rtol=1e-6)


def test_the_sanity_check_finds_a_broken_validation_before_training():
    """trainer/test_trainer.py::test_sanity_check... (num_sanity_val_steps=2 by default): a
    validation batch the module cannot take fails before the first train step, not after an
    epoch."""
    steps = Recorder()
    trainer = quiet_trainer(max_epochs=1, strategy="single", callbacks=[steps])
    bad_val = fj.DataLoader({"x": np.zeros((8, 3), np.float32), "y": np.zeros((8, 1), np.float32)}, batch_size=4)
    with pytest.raises(Exception):
        trainer.fit(Regressor(batchnorm=False), fj.DataLoader(regression_data(n=32), batch_size=4), bad_val)
    assert trainer.global_step == 0 and steps.sanity == 1 and "on_train_start" not in steps.hooks


@pytest.mark.parametrize("stage", ["train", "val", "test", "predict"])
def test_a_fraction_that_keeps_no_batch_is_an_error(stage):
    """trainer/test_dataloaders.py::test_error_raised_with_float_limited_eval_batches (and
    Lightning's `_parse_num_batches`, which every stage goes through): 0.1 of 5 batches rounds
    down to 0, and Lightning raises "You requested to check 0.1 of the `val_dataloader` but
    0.1 * 5 < 1. ... Try at least `limit_val_batches=0.2`". A fraction 0.0 stays "none"."""
    data = fj.DataLoader(regression_data(n=20), batch_size=4)  # 5 batches
    trainer = quiet_trainer(strategy="single", max_steps=1, **{f"limit_{stage}_batches": 0.1})
    run = {"train": lambda: trainer.fit(Regressor(), data), "val": lambda: trainer.fit(Regressor(), data, data),
           "test": lambda: trainer.test(Regressor(), data), "predict": lambda: trainer.predict(Regressor(), data)}
    with pytest.raises(ValueError, match=rf"limit_{stage}_batches=0.1\) keeps none of the 5 batches .*"
                                         rf"0.1 \* 5 < 1.*at least limit_{stage}_batches=0.2"):
        run[stage]()
    assert trainer.state is None  # raised before anything was built or trained


def test_lightnings_own_case_of_a_fraction_that_keeps_no_validation_batch():
    r"""Lightning's test_error_raised_with_float_limited_eval_batches, its numbers: a validation
    loader of 64 batches (BoringModel's), limit_val_batches = 1 / (64 + 2); Lightning matches
    rf"{limit_val_batches} \* {dl_size} < 1. Please increase the `limit_val_batches`" and its
    message ends "Try at least `limit_val_batches=0.015625`" (1 / 64)."""
    dl_size, limit = 64, 1 / (64 + 2)
    val = fj.DataLoader(regression_data(n=dl_size), batch_size=1)
    trainer = quiet_trainer(strategy="single", max_steps=1, limit_val_batches=limit)
    with pytest.raises(ValueError, match=rf"{limit} \* {dl_size} < 1\); increase it to at least "
                                         r"limit_val_batches=0.015625"):
        trainer.fit(Regressor(), fj.DataLoader(regression_data(n=16), batch_size=4), val)
    with pytest.raises(ValueError, match=rf"{limit} \* {dl_size} < 1"):
        trainer.validate(Regressor(), val)


class ValOutputs(fj.Callback):
    def __init__(self):
        self.seen = []

    def on_validation_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if not trainer.sanity_checking:
            self.seen.append((batch_idx, {k: np.asarray(v) for k, v in outputs.items()}))


class LitVal(fj.LitModule):
    def __init__(self):
        super().__init__()
        self.model = MLP(batchnorm=False)

    def training_step(self, batch, batch_idx):
        return ((self.model(batch["x"], train=True) - batch["y"]) ** 2).mean()

    def validation_step(self, batch, batch_idx):
        error = abs(self.model(batch["x"], train=False) - batch["y"]).mean()
        self.log("mae", error)
        return {"loss": ((self.model(batch["x"], train=False) - batch["y"]) ** 2).mean()}

    def configure_optimizers(self):
        return optax.sgd(0.01)


@pytest.mark.parametrize("module", [Regressor(batchnorm=False), LitVal()], ids=["native", "lightning"])
def test_on_validation_batch_end_receives_what_the_step_returned(module):
    """trainer/logging_/test_eval_loop_logging.py / callbacks/test_lambda_function.py style:
    Lightning passes `validation_step`'s return to `on_validation_batch_end(outputs=...)` (a
    dict with "loss" here). fitjax's outputs are that dict (for `loss`: its outputs dict, the
    predictions "pred") with the batch's values: the loss and every metric or logged value,
    each the mean over the batch's real examples; so over the batches, weighted by their
    sizes, they give the logged `val/...` means. The last batch (2 of 4 examples) is padded
    and its padding does not count, nor appear among the rows."""
    recorder = ValOutputs()
    trainer = quiet_trainer(strategy="single", max_epochs=1, callbacks=[recorder])
    val = fj.DataLoader(regression_data(n=10, seed=1), batch_size=4)
    trainer.fit(module, fj.DataLoader(regression_data(n=16), batch_size=4), val)
    assert [idx for idx, _ in recorder.seen] == [0, 1, 2]
    logged = {"loss": "val/loss", "mae": "val/mae" if isinstance(module, Regressor) else "mae"}  # Lightning's key
    for name, key in logged.items():
        mean = sum(values[name] * size for (_, values), size in zip(recorder.seen, (4, 4, 2))) / 10
        np.testing.assert_allclose(mean, trainer.callback_metrics[key], rtol=1e-5)
    # the batch's own numbers, recomputed on the host from the trained weights
    x, y = regression_data(n=10, seed=1)["x"][8:], regression_data(n=10, seed=1)["y"][8:]
    params, _ = module.variables
    pred = MLP(batchnorm=False).apply({"params": params}, x, train=False)
    np.testing.assert_allclose(recorder.seen[2][1]["loss"], float(((pred - y) ** 2).mean()), rtol=1e-5)
    if isinstance(module, Regressor):  # what its `loss` returned: the batch's real rows
        np.testing.assert_allclose(recorder.seen[2][1]["pred"], pred, rtol=1e-5)


class BatchEnds(fj.Callback):
    """The shapes the per-batch end hooks of validation, test and predict receive."""

    def __init__(self):
        self.seen = []

    def _note(self, stage, outputs, batch, batch_idx):
        self.seen.append((stage, batch_idx, jax.tree.map(np.shape, outputs), np.shape(batch["x"])))

    def on_validation_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self._note("val", outputs, batch, batch_idx)

    def on_test_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self._note("test", outputs, batch, batch_idx)

    def on_predict_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self._note("predict", {"pred": outputs}, batch, batch_idx)
        self.predicted = getattr(self, "predicted", []) + [np.asarray(outputs)]


def test_eval_and_predict_batch_hooks_get_the_batch_and_its_real_rows():
    """Lightning 2.6, 10 examples in batches of 4, a Linear(8, 1) module whose validation_step /
    test_step return {"loss": ...} and predict_step the predictions, a callback printing shapes:
    on_validation_batch_end and on_test_batch_end get batches (4, 8), (4, 8), (2, 8) and outputs
    {"loss": ()}; on_predict_batch_end gets batches (4, 8), (4, 8), (2, 8) and outputs (4, 1),
    (4, 1), (2, 1). fitjax pads every batch here to a multiple of the 8 devices ("dp"): the hooks
    still see the loader's batch and only its real rows (here `loss`'s outputs "pred" beside the
    batch's loss and metric)."""
    seen = BatchEnds()
    trainer = quiet_trainer(strategy="dp", max_epochs=1, num_sanity_val_steps=0, callbacks=[seen])
    module = Regressor(batchnorm=False)
    data = fj.DataLoader(regression_data(n=10, seed=1), batch_size=4)
    trainer.fit(module, fj.DataLoader(regression_data(n=16), batch_size=8), data)
    trainer.test(module, data)
    predictions = trainer.predict(module, data)
    sizes = [4, 4, 2]
    assert seen.seen == [(stage, i, {"loss": (), "mae": (), "pred": (size, 1)}, (size, 8))
                         for stage in ("val", "test") for i, size in enumerate(sizes)] + [
        ("predict", i, {"pred": (size, 1)}, (size, 8)) for i, size in enumerate(sizes)]
    np.testing.assert_array_equal(np.concatenate(seen.predicted), predictions)  # the rows predict returns
