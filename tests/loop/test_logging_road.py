"""The one road of logged values (fitjax/loop/metric_log.py's docstring): every number reaches the
loggers through the metric log, callbacks log with `module.log`, `callback_metrics` is a read."""

from __future__ import annotations

import ast
from pathlib import Path

import optax
import pytest
from helpers import Regressor, Rows, quiet_trainer, regression_data

import fitjax as fj

PACKAGE = Path(fj.__file__).parent


class Scheduled(Regressor):
    def configure_optimizer(self):
        return optax.inject_hyperparams(optax.sgd)(learning_rate=optax.linear_schedule(0.05, 0.01, 40))


def test_only_the_metric_log_and_the_loggers_call_log_metrics():
    callers = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "log_metrics"):
                callers.append(path.relative_to(PACKAGE).as_posix())
    assert callers and {c for c in callers if not c.startswith("loggers/")} == {"loop/metric_log.py"}


class Reader(fj.Callback):
    """Reads `callback_metrics` twice after each log step and checks the reads change nothing."""

    def __init__(self, rows: Rows):
        self.rows, self.seen_lr, self.reads = rows, [], 0

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if not trainer.progress.crossed(trainer.log_every_n_steps):
            return
        written, logged = len(self.rows.rows), dict(trainer.logged_metrics)
        first, second = trainer.callback_metrics, trainer.callback_metrics
        assert first == second and first is not second
        assert len(self.rows.rows) == written and trainer.logged_metrics == logged  # nothing written
        self.seen_lr.append(first.get("lr"))
        self.reads += 1
        with pytest.raises(TypeError, match=r"read-only.*module\.log\(name, value\)"):
            first["lr"] = 1.0


def test_every_logger_gets_rows_in_step_order_and_the_lr_reaches_callback_metrics():
    rows, other = Rows(), Rows()
    monitor, reader = fj.LearningRateMonitor(), Reader(rows)
    callbacks = [monitor, fj.ThroughputMonitor(batch_size_fn=lambda b: b["x"].shape[0], window_size=2),
                 fj.SpikeDetection(skip_update=True), reader]
    trainer = quiet_trainer(max_epochs=2, log_every_n_steps=3, steps_per_execution=2, logger=[rows, other],
                            callbacks=callbacks)
    data = fj.DataLoader(regression_data(n=160), batch_size=8)  # 20 steps an epoch, 10 calls
    trainer.fit(Scheduled(), data, fj.DataLoader(regression_data(n=32, seed=1), batch_size=8))
    for logger in (rows, other):
        steps = [step for step, _ in logger.rows]
        assert steps == sorted(steps), steps
    assert rows.rows == other.rows
    # the calls crossing 3, 6, 9, ... end at steps 4, 6, 10, 12, ...: rows at step - 1, each kind together
    expected = [3, 5, 9, 11, 15, 17, 21, 23, 27, 29, 33, 35, 39]
    for key in ("train/loss", "lr", "train/time", "train/skipped_spikes"):
        assert rows.steps_of(key) == expected, key
    # `lr` is in callback_metrics from the first log step on, and at the end holds the last one
    assert reader.reads == len(expected) and None not in reader.seen_lr
    assert reader.seen_lr == [lr for _, lr in monitor.history["lr"]]
    assert trainer.callback_metrics["lr"] == monitor.history["lr"][-1][1]


class EveryBatch(fj.Callback):
    """Logs with `module.log` at every batch, as a Lightning callback would."""

    def __init__(self):
        self.in_callback_metrics = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        module.log("batch_idx", float(batch_idx), prog_bar=True)
        self.in_callback_metrics.append(trainer.callback_metrics["batch_idx"])

    def on_validation_epoch_end(self, trainer, module):
        module.log("custom/val", 2.0 * trainer.current_epoch)


def test_a_callback_logs_with_module_log_at_log_steps_and_is_seen_at_once(tmp_path):
    rows, logging = Rows(), EveryBatch()
    checkpoint = fj.ModelCheckpoint(monitor="custom/val", mode="max")
    trainer = quiet_trainer(max_epochs=2, log_every_n_steps=4, logger=rows, callbacks=[logging, checkpoint],
                            enable_checkpointing=True, default_root_dir=tmp_path)
    trainer.fit(Regressor(), fj.DataLoader(regression_data(n=80), batch_size=8),
                fj.DataLoader(regression_data(n=16, seed=1), batch_size=8))
    # Lightning's: a batch hook's value reaches the loggers at log steps, callback_metrics every batch
    assert rows.steps_of("batch_idx") == [3, 7, 11, 15, 19]
    assert logging.in_callback_metrics == [float(i) for i in range(10)] * 2
    assert trainer.progress_bar_metrics["batch_idx"] == 9.0
    assert rows.steps_of("custom/val") == [9, 19]  # the validations at the epochs' ends
    assert checkpoint.best_model_score == pytest.approx(2.0)
