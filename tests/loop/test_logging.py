"""A fit's logs as a user finds them: TensorBoard events, metrics.csv, and `self.log` values."""

from __future__ import annotations

import csv
import warnings

import jax
import numpy as np
import optax
import pytest
from helpers import LossHistory, Regressor, quiet_trainer, regression_data
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import metadata

import fitjax as fj


class Logging(Regressor):
    def loss(self, model, batch):
        pred = model(batch["x"], train=self.training)
        loss = ((pred - batch["y"]) ** 2).mean()
        self.log("twice", 2 * loss)
        self.log_dict({"epoch_only": loss + 1}, on_step=False)
        return loss, {"pred": pred}

    def configure_optimizer(self):
        return optax.inject_hyperparams(optax.sgd)(learning_rate=optax.linear_schedule(0.05, 0.01, 16))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("logs")
    loggers = [fj.TensorBoardLogger(root, name="tb"), fj.CSVLogger(root, name="csv")]
    trainer = quiet_trainer(max_epochs=2, strategy="single", log_every_n_steps=4, logger=loggers,
                            callbacks=[fj.LearningRateMonitor()])
    trainer.fit(Logging(lr=0.07), fj.DataLoader(regression_data(), batch_size=32),  # 8 steps/epoch
                fj.DataLoader(regression_data(n=64, seed=1), batch_size=32))
    return trainer, root


def test_tensorboard_holds_every_key_at_its_global_steps_and_the_hparams(run):
    trainer, root = run
    events = EventAccumulator(str(root / "tb" / "version_0"), size_guidance={"scalars": 0})
    events.Reload()
    steps = {tag: [e.step for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    # Lightning's rows: the step index (global_step - 1) of the step that ends each window; epoch
    # means and validation at the epoch's last step (as `rows` in test_lightning_semantics.py)
    assert steps["train/loss"] == steps["train/twice"] == steps["lr"] == [3, 7, 11, 15]
    assert steps["train/loss_epoch"] == steps["train/epoch_only_epoch"] == steps["val/loss"] == [7, 15]
    assert "train/epoch_only" not in steps  # on_step=False
    last = {tag: events.Scalars(tag)[-1].value for tag in steps}
    assert last["train/twice"] == pytest.approx(2 * last["train/loss"], rel=1e-5)
    assert last["train/epoch_only_epoch"] == pytest.approx(last["train/loss_epoch"] + 1, rel=1e-5)
    assert last["val/twice"] == pytest.approx(2 * last["val/loss"], rel=1e-5)
    assert last["val/loss"] == pytest.approx(trainer.callback_metrics["val/loss"], rel=1e-6)

    start = metadata.parse_session_start_info_plugin_data(
        events.PluginTagToContent(metadata.PLUGIN_NAME)[metadata.SESSION_START_INFO_TAG])
    assert start.hparams["lr"].number_value == pytest.approx(0.07)
    assert start.hparams["batchnorm"].bool_value is True


def test_metrics_csv_has_one_row_per_logged_step(run):
    _, root = run
    with open(root / "csv" / "version_0" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in rows] == [3, 7, 11, 15]
    assert all(r["train/loss"] and r["lr"] for r in rows)
    assert [bool(r["val/loss"]) for r in rows] == [False, True, False, True]
    assert [r["epoch"] for r in rows] == ["0.0", "0.0", "1.0", "1.0"]
    assert (root / "csv" / "version_0" / "hparams.yaml").exists()


def test_log_outside_loss_and_metrics_and_bad_values_are_errors():
    with pytest.raises(RuntimeError, match=r"Regressor.log\('x', \.\.\.\) was called outside"):
        Regressor().log("x", 1.0)

    class Vector(Regressor):
        def metrics(self, batch, outputs):
            self.log("per_example", outputs["pred"][:, 0])
            return {}

    with pytest.raises(ValueError, match=r"Vector.log\('per_example', value\) must be one scalar.*\(16,\)"):
        quiet_trainer(max_steps=1, strategy="single").fit(Vector(), fj.DataLoader(regression_data(n=16), batch_size=16))

    class Clash(Regressor):
        def metrics(self, batch, outputs):
            self.log("mae", 0.0 * outputs["pred"].mean())
            return {"mae": abs(outputs["pred"] - batch["y"]).mean()}

    with pytest.raises(ValueError, match=r"Clash.log\('mae', \.\.\.\) logs a name `metrics` also returns"):
        quiet_trainer(max_steps=1, strategy="single").fit(Clash(), fj.DataLoader(regression_data(n=16), batch_size=16))


def test_a_value_logged_only_in_eval_mode_reaches_validation_only():
    class EvalOnly(Regressor):
        def metrics(self, batch, outputs):
            if not self.training:
                self.log("sq_pred", (outputs["pred"] ** 2).mean())
            return {}

    trainer = quiet_trainer(max_epochs=1, strategy="dp", devices=8)
    data = regression_data(n=64)
    module = EvalOnly()
    trainer.fit(module, fj.DataLoader(data, batch_size=32), fj.DataLoader(data, batch_size=24))  # 24+24+16
    assert "val/sq_pred" in trainer.callback_metrics and "train/sq_pred" not in trainer.callback_metrics
    preds = trainer.predict(module, fj.DataLoader({"x": data["x"]}, batch_size=64))
    assert trainer.callback_metrics["val/sq_pred"] == pytest.approx(float(np.mean(preds ** 2)), rel=1e-5)


class TrainLossSeen(fj.Callback):
    """`progress_bar_metrics["train/loss"]` as each step's hooks see it, and
    `callback_metrics["train/loss"]` at step 8 only."""

    def __init__(self):
        self.seen, self.read_at_8 = [], None

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.seen.append((trainer.global_step, trainer.progress_bar_metrics.get("train/loss")))
        if trainer.global_step == 8:
            self.read_at_8 = trainer.callback_metrics.get("train/loss")


def test_a_log_step_logs_its_window_mean_at_its_step_without_waiting_for_it(tmp_path):
    """The trainer does not wait for a log step's values: they reach the progress bar at a
    later step, by the next log step at the latest, and the loggers at the log step's number.
    `callback_metrics` holds each step's own value after that step (Lightning's)."""
    history, seen = LossHistory(), TrainLossSeen()
    trainer = quiet_trainer(max_epochs=1, strategy="single", log_every_n_steps=4, callbacks=[seen, history],
                            logger=fj.CSVLogger(tmp_path, name="csv"))
    trainer.fit(Regressor(batchnorm=False), fj.DataLoader(regression_data(n=384), batch_size=32))  # 12 steps
    with open(tmp_path / "csv" / "version_0" / "metrics.csv") as f:
        rows = {int(r["step"]): float(r["train/loss"]) for r in csv.DictReader(f) if r["train/loss"]}
    assert sorted(rows) == [3, 7, 11]  # Lightning's: the index of the window's last step
    for step, value in rows.items():  # equal batches: the window mean is the mean of its losses
        assert value == pytest.approx(np.mean(history.losses[step - 3:step + 1]), rel=1e-5)
    arrived = next(step for step, value in seen.seen if value is not None)
    assert 5 <= arrived <= 8
    # `callback_metrics` holds the last step's value, as Lightning's (issue 26), not the window's
    assert seen.read_at_8 == pytest.approx(history.losses[7])
    assert trainer.callback_metrics["train/loss"] == pytest.approx(history.losses[11])


class Rows(fj.loggers.Logger):
    """Every `log_metrics` call, in order (a real logger: the trainer calls it as any other)."""

    name, version = "rows", 0

    def __init__(self):
        self.rows = []

    def log_metrics(self, metrics, step):
        self.rows.append((step, dict(metrics)))

    def log_hyperparams(self, params):
        pass


class Reader(fj.Callback):
    """Reads `callback_metrics`, `checkpoint_meta` and the stage at step 8 (a log step's next)
    and notes how many rows the logger had before and after those reads."""

    def __init__(self, rows):
        self.rows, self.at_8 = rows, None

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step == 8:
            before = len(self.rows.rows)
            loss = trainer.callback_metrics["train/loss"], float(outputs["loss"])
            metas = trainer.checkpoint_meta(module), trainer.checkpoint_meta(module)
            self.at_8 = (before, len(self.rows.rows), loss, metas, trainer.progress.last_saved)
            with pytest.raises(AttributeError):
                trainer.sanity_checking = True
            with pytest.raises(AttributeError):  # frozen
                trainer.stage.verbose = False
            assert (trainer.stage.name, trainer.sanity_checking) == ("fit", False)


def test_reads_write_nothing():
    """Reading `callback_metrics` waits for the window on its way and shows its values, but the
    loggers get its row at the loop's next write, in the same order as without the read;
    `checkpoint_meta` is the same twice and records no save (`record_save` does)."""
    rows = Rows()
    reader = Reader(rows)
    trainer = quiet_trainer(max_epochs=1, strategy="single", log_every_n_steps=4, callbacks=[reader], logger=rows)
    trainer.fit(Regressor(batchnorm=False), fj.DataLoader(regression_data(n=384), batch_size=32))  # 12 steps
    before, after, loss, (meta, again), last_saved = reader.at_8
    assert before == after  # the read wrote no row
    assert meta == again and last_saved is None
    assert meta["progress"]["last_saved"] == [0, 8, 8]  # what a save now would record
    steps = [step for step, row in rows.rows if "train/loss" in row]
    assert steps == [3, 7, 11]
    assert loss[0] == pytest.approx(loss[1])  # the value read is the step's own (Lightning's)
    plain = Rows()
    quiet_trainer(max_epochs=1, strategy="single", log_every_n_steps=4, logger=plain).fit(
        Regressor(batchnorm=False), fj.DataLoader(regression_data(n=384), batch_size=32))
    assert [step for step, _ in plain.rows] == [step for step, _ in rows.rows]  # the same rows, same order


def test_an_epoch_shorter_than_the_logging_interval_warns_as_lightning_does(tmp_path):
    # Lightning 2.x, fit_loop.setup_data: warns when log_every_n_steps > the epoch's batches and a
    # logger is attached (not with logger=False, not with fast_dev_run)
    data = fj.DataLoader(regression_data(n=64), batch_size=16)  # 4 batches an epoch
    message = (r"The number of training batches \(4\) is smaller than the logging interval "
               r"Trainer\(log_every_n_steps=50\)\. Set a lower value for log_every_n_steps")
    with pytest.warns(UserWarning, match=message):
        quiet_trainer(max_epochs=1, strategy="single", logger=fj.CSVLogger(tmp_path)).fit(Regressor(), data)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        quiet_trainer(max_epochs=1, strategy="single").fit(Regressor(), data)  # no logger: nothing to see
        quiet_trainer(max_epochs=1, strategy="single", log_every_n_steps=4,
                      logger=fj.CSVLogger(tmp_path)).fit(Regressor(), data)


def _host_leaves(state):
    """The state's leaves as host arrays (random keys as their key data)."""
    return [np.array(jax.random.key_data(leaf) if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)
                     else leaf) for leaf in jax.tree.leaves(state)]


class ReadEverything(fj.Callback):
    """At every batch and epoch end of fit, reads every public read of the trainer (metrics,
    the checkpoint meta, stop and preemption flags, the progress and its queries, the stage) and
    checks, around those reads, that the loggers' files, `logged_metrics`, the progress bar's
    values and the train state are what they were before them."""

    def __init__(self, folder):
        self.folder, self.reads = folder, 0

    def _files(self):
        return {str(p): p.read_bytes() for p in sorted(self.folder.rglob("*")) if p.is_file()}

    def _read(self, trainer, module):
        files = self._files()
        logged, bar = dict(trainer.logged_metrics), dict(trainer.progress_bar_metrics)
        state = trainer.state
        leaves = _host_leaves(state)  # a copy: the next step donates the state
        progress = trainer.progress.state_dict()
        for _ in range(2):  # a second read of each is the same as the first
            metrics = dict(trainer.callback_metrics)
            meta = trainer.checkpoint_meta(module)
            flags = (trainer.should_stop, trainer.received_sigterm, trainer.sanity_checking,
                     trainer.stage, trainer.progress.crossed(2), trainer.progress.last_saved,
                     trainer.progress.last_logged, trainer.estimated_stepping_batches, trainer.log_dir,
                     trainer.num_training_batches, trainer.global_step, trainer.current_epoch)
            assert trainer.checkpoint_meta(module) == meta and dict(trainer.callback_metrics) == metrics
        assert self._files() == files
        assert (trainer.logged_metrics, trainer.progress_bar_metrics) == (logged, bar)
        assert trainer.progress.state_dict() == progress and trainer.state is state
        for leaf, before in zip(_host_leaves(trainer.state), leaves, strict=True):
            np.testing.assert_array_equal(leaf, before)
        assert flags[:2] == (False, False)
        self.reads += 1

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self._read(trainer, module)

    def on_validation_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if not trainer.sanity_checking:
            self._read(trainer, module)

    def on_train_epoch_end(self, trainer, module):
        self._read(trainer, module)

    def on_validation_epoch_end(self, trainer, module):
        if not trainer.sanity_checking:
            self._read(trainer, module)


def _fit_logging_to_files(root, callbacks):
    loggers = [fj.TensorBoardLogger(root, name="tb"), fj.CSVLogger(root, name="csv")]
    trainer = quiet_trainer(max_epochs=2, strategy="single", log_every_n_steps=3, logger=loggers,
                            callbacks=callbacks, val_check_interval=5)
    trainer.fit(Logging(lr=0.07), fj.DataLoader(regression_data(n=160), batch_size=16),  # 10 steps/epoch
                fj.DataLoader(regression_data(n=48, seed=1), batch_size=16))
    events = EventAccumulator(str(root / "tb" / "version_0"), size_guidance={"scalars": 0})
    events.Reload()
    scalars = {tag: [(e.step, e.value) for e in events.Scalars(tag)]
               for tag in events.Tags()["scalars"] if not tag.startswith("compile/")}
    with open(root / "csv" / "version_0" / "metrics.csv") as f:
        rows = [_no_compile_times(row) for row in csv.DictReader(f)]
    return trainer, scalars, rows


def _no_compile_times(values):
    """`values` without the compile times: wall seconds of the programs XLA compiled, which
    differ from run to run (and a process's second fit finds some compiled already)."""
    return {key: value for key, value in values.items() if not key.startswith("compile/")}


def test_reading_between_steps_changes_no_file_no_logged_value_and_no_state(tmp_path):
    """Issue 24, item 2: reads are reads. A callback that reads everything a callback can read
    at every batch and epoch end (`callback_metrics` waits for the log window on its way) leaves
    the same TensorBoard scalars, the same metrics.csv, the same `logged_metrics` and
    `callback_metrics` and bitwise the same weights as a run that reads nothing."""
    reader = ReadEverything(tmp_path / "read")
    read, read_scalars, read_csv = _fit_logging_to_files(tmp_path / "read", [reader])
    plain, plain_scalars, plain_csv = _fit_logging_to_files(tmp_path / "plain", [])
    assert reader.reads == 20 + 2 + 4 * 3 + 4  # batches, epochs, validation batches, validations
    assert read_scalars == plain_scalars and read_csv == plain_csv
    assert len(read_scalars["train/loss"]) == 6  # the windows were logged: steps 2, 5, 8, ...
    assert _no_compile_times(read.logged_metrics) == _no_compile_times(plain.logged_metrics)
    assert read.callback_metrics == plain.callback_metrics
    assert read.progress.state_dict() == plain.progress.state_dict()
    for a, b in zip(_host_leaves(read.state), _host_leaves(plain.state), strict=True):
        np.testing.assert_array_equal(a, b)
