"""MLFlowLogger in a real fit, read back with MLflow's own client from the local store."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from helpers import Regressor, regression_data

import fitjax as fj
from fitjax.loggers import CSVLogger, MLFlowLogger

mlflow_tracking = pytest.importorskip("mlflow.tracking")


def test_fit_logs_params_metrics_at_their_steps_tags_and_kept_checkpoints(tmp_path):
    mlflow_logger = MLFlowLogger(experiment_name="regression", run_name="first", tags={"team": "obs"},
                                 save_dir=tmp_path / "mlruns", log_model=True)
    csv_logger = CSVLogger(tmp_path)  # the same values through another logger: what MLflow must hold
    ckpt = fj.ModelCheckpoint(dirpath=tmp_path / "ckpt", monitor="val/loss", save_top_k=1)
    trainer = fj.Trainer(max_epochs=3, strategy="dp", logger=[mlflow_logger, csv_logger], callbacks=[ckpt],
                         log_every_n_steps=2, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Regressor(lr=0.1), fj.DataLoader(regression_data(n=128), batch_size=32),
                fj.DataLoader(regression_data(n=64, seed=1), batch_size=32))

    client = mlflow_tracking.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("regression").experiment_id])
    assert run.info.run_id == mlflow_logger.version and run.info.status == "FINISHED"
    assert run.info.run_name == "first" and run.data.tags["team"] == "obs"
    assert run.data.params == {"lr": "0.1", "batchnorm": "True"}

    with (Path(csv_logger.log_dir) / "metrics.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    for key in ("train/loss", "val/loss", "train/loss_epoch"):
        expected = [(int(r["step"]), float(r[key])) for r in rows if r.get(key)]
        history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
        assert [step for step, _ in history] == [step for step, _ in expected], key
        assert [value for _, value in history] == pytest.approx([value for _, value in expected], rel=1e-6), key
    val_steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, "val/loss"))
    assert val_steps == [3, 7, 11]  # each epoch's end, at global_step - 1 as Lightning logs it

    # log_model=True: the checkpoint kept at the end (the best of save_top_k=1), with its files.
    (kept,) = [p for p in (tmp_path / "ckpt").iterdir()]
    assert Path(ckpt.best_model_path) == kept
    uploaded = [a.path for a in client.list_artifacts(run.info.run_id, "checkpoints")]
    assert uploaded == [f"checkpoints/{kept.name}"]
    files = {a.path.rsplit("/", 1)[-1] for a in client.list_artifacts(run.info.run_id, f"checkpoints/{kept.name}")}
    assert {"state", "meta"} <= files


def test_only_process_zero_writes_and_bad_arguments_are_named(tmp_path):
    logger = MLFlowLogger(save_dir=tmp_path / "mlruns", process_index=1)
    logger.log_hyperparams({"lr": 0.1})
    logger.log_metrics({"train/loss": 1.0}, step=1)
    logger.finalize("success")
    assert not (tmp_path / "mlruns").exists() and logger.run_id is None

    with pytest.raises(ValueError, match=r"log_model=.*'all'.*got 'best'"):
        MLFlowLogger(log_model="best")
    with pytest.raises(ValueError, match=r"experiment_name=.*got ''"):
        MLFlowLogger(experiment_name="")
