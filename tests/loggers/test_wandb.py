"""WandbLogger in a real offline fit (no network, no account), read back from W&B's run files.

The offline run's `run-<id>.wandb` file is W&B's transaction log: 32 KiB blocks of records in
LevelDB's log framing, each a `wandb_internal_pb2.Record` protobuf. `_records` reads it with W&B's
own protobuf classes; wandb ships no Python reader for it.
"""

from __future__ import annotations

import csv
import json
import struct
from pathlib import Path

import pytest
from helpers import Regressor, regression_data

import fitjax as fj
from fitjax.loggers import CSVLogger, WandbLogger

wandb = pytest.importorskip("wandb")
wandb_pb = pytest.importorskip("wandb.proto.wandb_internal_pb2")

_BLOCK = 32 * 1024
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _records(path: Path) -> list:
    data = path.read_bytes()
    assert data[:4] == b":W&B", "not a W&B transaction log"
    records, pos, pending = [], 7, b""  # 7: ":W&B", a 2-byte magic and a version byte
    while pos + 7 <= len(data):
        if _BLOCK - pos % _BLOCK < 7:  # a block's tail too short for a header is padding
            pos += _BLOCK - pos % _BLOCK
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == _FULL:
            records.append(chunk)
        elif kind == _FIRST:
            pending = chunk
        elif kind == _MIDDLE:
            pending += chunk
        elif kind == _LAST:
            records.append(pending + chunk)
        else:
            break
    parsed = []
    for raw in records:
        record = wandb_pb.Record()
        record.ParseFromString(raw)
        parsed.append(record)
    return parsed


def test_offline_fit_logs_config_metrics_at_their_steps_and_each_checkpoint(tmp_path, monkeypatch):
    for var in ("WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_CONFIG_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb_home"))
    wandb_logger = WandbLogger(project="regression", name="first", save_dir=tmp_path, offline=True,
                               log_model="all")
    csv_logger = CSVLogger(tmp_path)
    ckpt = fj.ModelCheckpoint(dirpath=tmp_path / "ckpt", save_top_k=-1)  # one per epoch, all kept
    trainer = fj.Trainer(max_epochs=2, strategy="dp", logger=[wandb_logger, csv_logger], callbacks=[ckpt],
                         log_every_n_steps=2, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Regressor(lr=0.1), fj.DataLoader(regression_data(n=128), batch_size=32),
                fj.DataLoader(regression_data(n=64, seed=1), batch_size=32))

    wandb.teardown()  # W&B's service writes the run file out when it stops, as at the process's exit
    (run_dir,) = (tmp_path / "wandb").glob("offline-run-*")
    records = _records(run_dir / f"run-{wandb_logger.version}.wandb")
    by_kind: dict[str, list] = {}
    for record in records:
        by_kind.setdefault(record.WhichOneof("record_type"), []).append(record)

    (run,) = [r.run for r in by_kind["run"]]
    assert (run.project, run.display_name, run.run_id) == ("regression", "first", wandb_logger.version)
    config = {u.key: json.loads(u.value_json) for r in by_kind["config"] for u in r.config.update}
    assert config["lr"] == 0.1 and config["batchnorm"] is True

    rows = [{i.nested_key[0] if i.nested_key else i.key: json.loads(i.value_json) for i in r.history.item}
            for r in by_kind["history"]]
    with (Path(csv_logger.log_dir) / "metrics.csv").open(newline="") as f:
        expected_rows = list(csv.DictReader(f))
    for key in ("train/loss", "val/loss", "train/loss_epoch"):
        expected = [(int(r["step"]), float(r[key])) for r in expected_rows if r.get(key)]
        logged = sorted((row["trainer/global_step"], row[key]) for row in rows if key in row)
        assert [step for step, _ in logged] == [step for step, _ in expected], key
        assert [value for _, value in logged] == pytest.approx([value for _, value in expected], rel=1e-6), key

    # log_model="all": one model artifact per saved checkpoint, with the checkpoint's files.
    artifacts = [r.artifact for r in by_kind.get("artifact", [])]
    assert [a.type for a in artifacts] == ["model", "model"]
    assert {a.name for a in artifacts} == {f"model-{wandb_logger.version}"}
    saved = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert sorted(json.loads(a.metadata)["path"].rsplit("/", 1)[-1] for a in artifacts) == saved
    for artifact in artifacts:
        paths = {entry.path.split("/")[0] for entry in artifact.manifest.contents}
        assert {"state", "meta"} <= paths

    assert [r.exit.exit_code for r in by_kind["exit"]] == [0]


def test_only_process_zero_starts_a_run_and_bad_arguments_are_named(tmp_path):
    logger = WandbLogger(save_dir=tmp_path, offline=True, process_index=1)
    logger.log_hyperparams({"lr": 0.1})
    logger.log_metrics({"train/loss": 1.0}, step=1)
    logger.finalize("success")
    assert not (tmp_path / "wandb").exists() and logger.version == ""
    with pytest.raises(ValueError, match=r"log_model=.*got 'best'"):
        WandbLogger(log_model="best")
