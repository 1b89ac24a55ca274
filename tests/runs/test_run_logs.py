"""Each run of a `Trainer(runs=...)` fit is a run: its own TensorBoard and CSV folder with its
curves and HPARAMS session (read back with TensorBoard's reader), a results table and `best_run`;
a run stopped early by `EarlyStopping` logs nothing after its stop."""

from __future__ import annotations

import csv

import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import metadata

import fitjax as fj
from test_many_runs import Decayed, loader


def test_each_run_logs_to_its_own_tensorboard_run_and_the_best_is_named(tmp_path, capsys):
    runs = [{"lr": 0.0}, {"lr": 0.05}]  # a learning rate of 0 learns nothing: the other run is best
    # run 0's val/loss stays high (~12.7): it stops at its first check (epoch 0), run 1 (~4-7) trains on
    stopper = fj.EarlyStopping("val/loss", patience=100, divergence_threshold=10.0)
    loggers = [fj.TensorBoardLogger(tmp_path), fj.CSVLogger(tmp_path, name="csv")]
    trainer = fj.Trainer(max_epochs=3, runs=runs, logger=loggers, log_every_n_steps=2, callbacks=[stopper],
                         enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
    trainer.fit(Decayed(), loader(), loader())
    assert stopper.stopped_runs == [0, None] and trainer.current_epoch == 3

    version = tmp_path / "fitjax_logs" / "version_0"
    assert sorted(p.name for p in version.iterdir() if p.is_dir()) == ["lr=0", "lr=0.05"]
    last_rows = [3, 11]  # run 0's last row is its stop: epoch 0's validation, at step 3
    for i, name in enumerate(trainer.runs.names):
        events = EventAccumulator(str(version / name), size_guidance={"scalars": 0})
        events.Reload()
        tags = set(events.Tags()["scalars"])
        assert {"train/loss", "val/loss", "val/mae", "train/loss_epoch"} <= tags  # plain keys, no suffix
        val = [(e.step, e.value) for e in events.Scalars("val/loss")]
        assert [step for step, _ in val] == [3, 7, 11][:last_rows[i] // 4 + 1]  # one per epoch's validation, to its stop
        np.testing.assert_allclose(val[-1][1], trainer.callback_metrics[f"val/loss/run_{i}"], rtol=1e-6)
        assert max(e.step for tag in tags for e in events.Scalars(tag)) == last_rows[i]
        epoch_means = events.Scalars("train/loss_epoch")
        assert epoch_means[-1].step == last_rows[i]  # its stop's epoch is in
        # the results hold its values at its stop too (a stopped run's later epochs' means differ)
        np.testing.assert_allclose(trainer.run_results.final[i]["train/loss_epoch"], epoch_means[-1].value, rtol=1e-6)
        start = metadata.parse_session_start_info_plugin_data(
            events.PluginTagToContent(metadata.PLUGIN_NAME)[metadata.SESSION_START_INFO_TAG])
        assert start.hparams["lr"].number_value == runs[i]["lr"] and start.hparams["seed"].number_value == 0
        with open(tmp_path / "csv" / "version_0" / name / "metrics.csv") as rows:
            steps = [int(row["step"]) for row in csv.DictReader(rows)]
        assert max(steps) == last_rows[i] and steps == sorted(steps)
    shared = EventAccumulator(str(version), size_guidance={"scalars": 0})
    shared.Reload()
    assert not any("/run_" in tag for tag in shared.Tags()["scalars"])  # no run's values left behind

    results = trainer.run_results
    assert trainer.best_run == 1 and results.monitor == "val/loss"
    for i in range(2):
        assert results.final[i]["val/loss"] == trainer.callback_metrics[f"val/loss/run_{i}"]
        assert results.best[i]["val/loss"] <= results.final[i]["val/loss"]
    table = results.table()
    assert table in capsys.readouterr().out  # logged at the end of fit (the "fitjax" logger, INFO)
    lines = table.splitlines()
    assert lines[0].startswith("Runs (2), best by val/loss (min): run 1 (lr=0.05)")
    assert lines[1].endswith("stopped (epoch)") and lines[2].endswith(" 0") and lines[3].endswith(" -")
    assert "1*" in lines[3]
