"""A run's TensorBoard events, read back with the tensorboard package's own reader."""

from __future__ import annotations

from pathlib import Path

import optax

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


def test_compile_seconds_are_one_text_table_and_identical_runs_log_the_same_scalar_tags(tmp_path):
    # Each program's compile seconds were a one-point scalar card above the train/val curves, and
    # the programs JAX compiled (an eager `cos` of LearningRateMonitor's schedule) differed from run
    # to run: now the scalars are the same cards every run and the seconds one table in the Text tab.
    def run(version):
        module = Regressor(lr=0.1)
        module.lr_schedule = optax.cosine_decay_schedule(0.1, 8)  # read by LearningRateMonitor on the host
        module.configure_optimizer = lambda: optax.sgd(module.lr_schedule)
        # compile_cache=False: the second run's cache hit would take the train step under the
        # table's 0.1 s threshold, and the table is what this test reads
        trainer = fj.Trainer(max_epochs=1, strategy="single", log_every_n_steps=2, enable_progress_bar=False,
                             enable_checkpointing=False, enable_model_summary=False, compile_cache=False,
                             logger=fj.TensorBoardLogger(tmp_path, version=version),
                             callbacks=[fj.LearningRateMonitor()])
        trainer.fit(module, fj.DataLoader(regression_data(n=64), batch_size=16),
                    fj.DataLoader(regression_data(n=16, seed=1), batch_size=16))
        events = EventAccumulator(trainer.log_dir, size_guidance={"scalars": 0, "tensors": 0})
        events.Reload()
        return events

    first, second = run(0), run(1)
    assert sorted(first.Tags()["scalars"]) == sorted(second.Tags()["scalars"])
    assert {"train/loss", "val/loss", "lr"} <= set(first.Tags()["scalars"]), first.Tags()["scalars"]
    assert not [tag for tag in first.Tags()["scalars"] if tag.startswith("compile")]
    for events in (first, second):
        assert events.Tags()["tensors"] == ["compile_seconds/text_summary"]
        (table, *_) = events.Tensors("compile_seconds/text_summary")
        text = table.tensor_proto.string_val[0].decode()
        assert table.step == 1 and text.startswith("| program | compile seconds |\n|---|---:|\n")
        seconds = {row.split(" | ")[0].strip("| "): float(row.split(" | ")[1].strip(" |"))
                   for row in text.splitlines()[2:]}
        assert seconds["train_step"] > 0
