"""Each run of a `Trainer(runs=...)` fit is a run: its own TensorBoard folder with its curves and
HPARAMS session (read back with TensorBoard's reader), a results table and `best_run`."""

from __future__ import annotations

import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import metadata

import fitjax as fj
from test_many_runs import Decayed, loader


def test_each_run_logs_to_its_own_tensorboard_run_and_the_best_is_named(tmp_path, capsys):
    runs = [{"lr": 0.0}, {"lr": 0.05}]  # a learning rate of 0 learns nothing: the other run is best
    trainer = fj.Trainer(max_epochs=2, runs=runs, default_root_dir=tmp_path, log_every_n_steps=2,
                         enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
    trainer.fit(Decayed(), loader(), loader())

    version = tmp_path / "fitjax_logs" / "version_0"
    assert sorted(p.name for p in version.iterdir() if p.is_dir()) == ["lr=0", "lr=0.05"]
    for i, name in enumerate(trainer.runs.names):
        events = EventAccumulator(str(version / name), size_guidance={"scalars": 0})
        events.Reload()
        tags = set(events.Tags()["scalars"])
        assert {"train/loss", "val/loss", "val/mae", "train/loss_epoch"} <= tags  # plain keys, no suffix
        val = [(e.step, e.value) for e in events.Scalars("val/loss")]
        assert [step for step, _ in val] == [3, 7]  # one point per epoch's validation
        np.testing.assert_allclose(val[-1][1], trainer.callback_metrics[f"val/loss/run_{i}"], rtol=1e-6)
        start = metadata.parse_session_start_info_plugin_data(
            events.PluginTagToContent(metadata.PLUGIN_NAME)[metadata.SESSION_START_INFO_TAG])
        assert start.hparams["lr"].number_value == runs[i]["lr"] and start.hparams["seed"].number_value == 0
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
    assert table.splitlines()[0].startswith("Runs (2), best by val/loss (min): run 1 (lr=0.05)")
    assert "1*" in table.splitlines()[3]
