"""A run's TensorBoard events, read back with the tensorboard package's own reader."""

from __future__ import annotations

from pathlib import Path

from helpers import Regressor, regression_data
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import fitjax as fj


def test_fit_writes_train_and_val_scalars_under_default_root_dir(tmp_path):
    trainer = fj.Trainer(max_epochs=2, strategy="single", default_root_dir=tmp_path,
                         log_every_n_steps=2, enable_progress_bar=False)
    trainer.fit(Regressor(lr=0.1), fj.DataLoader(regression_data(n=128), batch_size=32),
                fj.DataLoader(regression_data(n=64, seed=1), batch_size=32))
    log_dir = Path(trainer.log_dir)
    assert log_dir.parent == tmp_path / "fitjax_logs" and log_dir.name == "version_0"

    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"train/loss", "train/mae", "train/loss_epoch", "val/loss", "val/mae"} <= tags
    loss_steps = [e.step for e in events.Scalars("train/loss")]
    assert loss_steps == [1, 3, 5, 7]  # every 2 steps, at global_step - 1 as Lightning logs them
    val = events.Scalars("val/loss")
    assert [e.step for e in val] == [3, 7]
    assert val[-1].value == trainer.callback_metrics["val/loss"]
