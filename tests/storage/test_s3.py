"""Checkpoints on an S3-compatible store: moto's server on 127.0.0.1 (tests/storage/conftest.py),
reached through the same s3fs and botocore a user's AWS or MinIO bucket is. The tests taking
`store_bucket` run on a GCS emulator too, through gcsfs, as a user's `gs://` bucket is reached."""

from __future__ import annotations

import csv
import io
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest
from helpers import LossHistory, Regressor, quiet_trainer, regression_data
from store_parts import listed

import fitjax as fj
from fitjax import checkpoint

DATA = regression_data(n=64)  # 4 batches of 16 an epoch
VAL = regression_data(n=32, seed=1)
HERE = Path(__file__).resolve().parent


pytestmark = pytest.mark.usefixtures("compile_cache")  # tests/conftest.py


def _callbacks(root: str) -> list[fj.ModelCheckpoint]:
    return [fj.ModelCheckpoint(f"{root}/best", monitor="val/loss", save_top_k=2),
            fj.ModelCheckpoint(f"{root}/steps", every_n_train_steps=3, save_top_k=2, save_last=True)]


def _fit(callbacks, *, max_epochs, ckpt_path=None):
    history = LossHistory()
    trainer = quiet_trainer(max_epochs=max_epochs, callbacks=[history, *callbacks], enable_checkpointing=True)
    module = Regressor(batchnorm=False)
    trainer.fit(module, fj.DataLoader(DATA, batch_size=16, shuffle=True, seed=2), fj.DataLoader(VAL, batch_size=16),
                ckpt_path=ckpt_path)
    return trainer, module, history.losses


def test_two_callbacks_on_a_store_resume_last_bitwise_keep_top_k_and_load(store_bucket, tmp_path):
    bucket = store_bucket
    whole_cbs = _callbacks(str(tmp_path / "local"))
    _, whole, whole_losses = _fit(whole_cbs, max_epochs=4)

    _, _, first = _fit(_callbacks(f"{bucket}/run"), max_epochs=2)
    resumed_cbs = _callbacks(f"{bucket}/run")
    trainer, module, rest = _fit(resumed_cbs, max_epochs=4, ckpt_path="last")
    assert first + rest == whole_losses  # the same losses at every step, bitwise
    for a, b in zip(jax.tree.leaves(module.variables), jax.tree.leaves(whole.variables)):
        np.testing.assert_array_equal(a, b)
    # top-k deletion on the store: exactly what each callback keeps, as on local disk
    for on_s3, local in zip(resumed_cbs, whole_cbs):
        assert listed(str(on_s3.dirpath)) == sorted(p.name for p in Path(local.dirpath).iterdir())
        assert str(on_s3.best_model_path).startswith(f"{bucket}/run/")
    # load_from_checkpoint and predict straight from the store
    assert Path(str(resumed_cbs[1].last_model_path)).name == Path(whole_cbs[1].last_model_path).name
    loaded = Regressor.load_from_checkpoint(resumed_cbs[1].last_model_path, batchnorm=False)
    local = Regressor.load_from_checkpoint(whole_cbs[1].last_model_path, batchnorm=False)
    for a, b in zip(jax.tree.leaves(loaded.variables), jax.tree.leaves(local.variables)):
        np.testing.assert_array_equal(a, b)
    assert trainer.validate(module, fj.DataLoader(VAL, batch_size=16), ckpt_path="best", verbose=False)


@pytest.mark.parametrize("store", ["s3", "gs"])
@pytest.mark.parametrize("where", ["dirpath", "default_root_dir"])
def test_a_bucket_that_does_not_exist_fails_before_the_first_step_naming_it(store, where, request):
    request.getfixturevalue({"s3": "s3_server", "gs": "gcs_server"}[store])
    history = LossHistory()
    url = f"{store}://no-such-bucket-fitjax/run"
    trainer = quiet_trainer(max_epochs=1, enable_checkpointing=True, **(
        {"callbacks": [history, fj.ModelCheckpoint(url)]} if where == "dirpath"
        else {"callbacks": [history], "default_root_dir": url, "logger": fj.TensorBoardLogger(url)}))
    with pytest.raises(PermissionError, match=rf"'{store}://no-such-bucket-fitjax/run.*'.*bucket") as error:
        trainer.fit(Regressor(batchnorm=False), fj.DataLoader(DATA, batch_size=16))
    assert history.losses == [] and len(str(error.value).splitlines()) == 1


_CHILD = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    import fitjax as fj
    from helpers import Regressor, regression_data

    trainer = fj.Trainer(max_steps=10, strategy="single", logger=False, enable_progress_bar=False,
                         enable_model_summary=False,
                         callbacks=[fj.ModelCheckpoint({url!r}, every_n_train_steps=1, save_top_k=2)])
    trainer.fit(Regressor(batchnorm=False), fj.DataLoader(regression_data(n=64), batch_size=16),
                ckpt_path="last")
    print("not killed")
""")


def _killed_during_upload(proxy, url: str, tmp: Path, step: int, nth) -> tuple[str, int]:
    """Runs `_CHILD` (resuming from "last") and SIGKILLs it when it sends its `nth` object
    (`nth(names)` says which) of the upload of `epoch=0-step=<step>`, before the store gets
    it: a real kill at a real point of a real upload. Returns the child's output and pid."""
    (tmp / "temp").mkdir(exist_ok=True)
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "", "JAX_COMPILATION_CACHE_DIR": str(tmp / "xla"),
           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "TMPDIR": str(tmp / "temp")}
    out, pid, _ = proxy.kill_child(
        [sys.executable, "-c", _CHILD.format(tests=str(HERE.parent), url=url)], env,
        lambda method, path: path.rsplit(f"-step={step}/", 1)[1] if method == "PUT" and f"-step={step}/" in path
        else None, nth)
    return out, pid


def _lease_of(pid: int) -> str:
    from fitjax.checkpoint import _lease

    return f"{_lease.PREFIX}{_lease._host()}-{pid}"


def test_kill_9_at_any_object_of_an_upload_leaves_only_loadable_names_and_last_resumes(proxy, bucket, tmp_path):
    url = f"{bucket}/killed"
    staged = lambda pid: list((tmp_path / "temp").glob(f"fitjax-stage-{pid}-*"))
    # killed half-way through the save at step 3 (at its fifth object) ...
    _, first = _killed_during_upload(proxy, url, tmp_path, 3, lambda sent: len(sent) == 5)
    assert staged(first)  # its staging copy, left by the kill
    # the killed fit's lease stays (hidden, dead with its process) until the next fit's start
    assert listed(url) == [_lease_of(first), "epoch=0-step=1", "epoch=0-step=2", "epoch=0-step=3"]
    assert checkpoint.damage(f"{url}/epoch=0-step=3") == ".fitjax-complete is missing (an incomplete upload)"
    assert checkpoint.latest_checkpoint([url]) == checkpoint.local_path(f"{url}/epoch=0-step=2")
    # ... then a resumed run at the last object of its save at step 4 (every file up but the marker)
    out, second = _killed_during_upload(proxy, url, tmp_path, 4, lambda sent: sent[-1] == ".fitjax-complete")
    assert f"fitjax: removing {url}/epoch=0-step=3," in out  # the next writer removed the torn upload
    assert not staged(first) and staged(second)  # and the staging copy the killed one left
    assert listed(url) == [_lease_of(second), "epoch=0-step=2", "epoch=0-step=3", "epoch=0-step=4"]
    assert not checkpoint.is_checkpoint(f"{url}/epoch=0-step=4")
    assert checkpoint.latest_checkpoint([url]) == checkpoint.local_path(f"{url}/epoch=0-step=3")

    history = LossHistory()
    trainer = quiet_trainer(max_steps=5, enable_checkpointing=True,
                            callbacks=[history, fj.ModelCheckpoint(url, every_n_train_steps=1, save_top_k=2)])
    trainer.fit(Regressor(batchnorm=False), fj.DataLoader(DATA, batch_size=16), ckpt_path="last")
    assert trainer.global_step == 5 and len(history.losses) == 2  # resumed after step 3
    assert listed(url) == ["epoch=0-step=4", "epoch=1-step=5"]
    for name in listed(url):  # every name under the folder loads
        checkpoint.verify(f"{url}/{name}")


def _logged_fit(root: str):
    loggers = [fj.loggers.TensorBoardLogger(root), fj.loggers.CSVLogger(root, name="csv")]
    trainer = quiet_trainer(max_epochs=2, enable_checkpointing=True, logger=loggers, log_every_n_steps=2,
                            default_root_dir=root)
    trainer.fit(Regressor(batchnorm=False), fj.DataLoader(DATA, batch_size=16), fj.DataLoader(VAL, batch_size=16))
    return trainer


def _scalars(folder: Path) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_logs_and_default_checkpoints_under_a_store_root_equal_a_local_run(store_bucket, tmp_path, monkeypatch):
    import fsspec

    bucket = store_bucket
    local = tmp_path / "local"
    _logged_fit(str(local))
    root = f"{bucket}/runs"
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    (temp / "fitjax-logs-notes").mkdir()  # not this run's: kept
    trainer = _logged_fit(root)
    # the loggers' local mirrors are gone once fit's end finalized them
    assert sorted(p.name for p in temp.iterdir() if p.name.startswith("fitjax-logs")) == ["fitjax-logs-notes"]
    log_dir = f"{root}/fitjax_logs/version_0"
    assert str(trainer.checkpoint_callback.dirpath) == f"{log_dir}/checkpoints"
    assert listed(f"{log_dir}/checkpoints") == ["epoch=1-step=8"]
    fs, _ = fsspec.core.url_to_fs(root)
    fs.get(f"{log_dir}/", str(tmp_path / "tb"), recursive=True)  # TensorBoard's reader takes local folders
    # everything but compile times (seconds measured in each run)
    on_s3, on_disk = ({k: v for k, v in _scalars(folder).items() if not k.startswith("compile/")}
                      for folder in (tmp_path / "tb", local / "fitjax_logs" / "version_0"))
    assert on_s3 == on_disk and len(on_s3["train/loss"]) == 4 and on_s3["val/loss"]
    for name in ("fitjax_logs/version_0/hparams.yaml", "csv/version_0/hparams.yaml"):
        assert fs.cat_file(f"{root}/{name}").decode() == (local / name).read_text()
    rows = lambda text: [{k: v for k, v in row.items() if not k.startswith("compile/")}
                         for row in csv.DictReader(io.StringIO(text))]
    csv_name = "csv/version_0/metrics.csv"
    fitted = rows(fs.cat_file(f"{root}/{csv_name}").decode())
    assert fitted == rows((local / csv_name).read_text())
    # logging after fit's end goes on from the store's file: its rows kept, the new one added
    trainer.validate(trainer.lightning_module, fj.DataLoader(VAL, batch_size=16))
    after = rows(fs.cat_file(f"{root}/{csv_name}").decode())
    assert after[:-1] == fitted and after[-1]["val/loss"]


def test_no_credentials_is_one_line_naming_the_url_and_what_to_set(s3_server, tmp_path):
    # a fresh process: s3fs keeps the credentials it found, so this one must never have had any
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(HERE.parent)!r})
        import fitjax as fj
        from helpers import Regressor, quiet_trainer, regression_data
        trainer = quiet_trainer(max_epochs=1, enable_checkpointing=True,
                                callbacks=[fj.ModelCheckpoint("s3://some-bucket/run")])
        try:
            trainer.fit(Regressor(batchnorm=False), fj.DataLoader(regression_data(n=32), batch_size=16))
        except PermissionError as error:
            print("ERROR", error)
    """)
    env = {k: v for k, v in os.environ.items() if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    env.update(AWS_EC2_METADATA_DISABLED="true", AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
               AWS_CONFIG_FILE=str(tmp_path / "none"), JAX_PLATFORMS="cpu", XLA_FLAGS="")
    child = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    line = child.stdout.split("ERROR ", 1)[-1].strip()
    assert line.startswith("ModelCheckpoint cannot write checkpoints to 's3://some-bucket/run': "
                           "NoCredentialsError"), child.stdout[-2000:] + child.stderr[-2000:]
    assert "AWS_ACCESS_KEY_ID" in line and "\n" not in line


def test_a_program_ending_without_finalize_leaves_no_logger_mirror(bucket, tmp_path):
    """The mirror of a logger never finalized goes when the process ends, once its files are
    on the store; one whose files did not get there is kept and named."""
    script = textwrap.dedent(f"""
        import fitjax as fj
        uploaded, stuck = fj.loggers.CSVLogger({bucket!r}), fj.loggers.CSVLogger({bucket!r}, name="stuck")
        for logger in (uploaded, stuck):
            logger.log_hyperparams({{"lr": 0.1}})
            logger.log_metrics({{"loss": 1.0}}, step=0)
        uploaded.save()  # on the store; `stuck` never uploads its hparams.yaml
    """)
    temp = tmp_path / "tmp"
    temp.mkdir()
    (temp / "fitjax-logs-notes").mkdir()  # not the program's: kept
    env = {**os.environ, "TMPDIR": str(temp), "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""}
    child = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert child.returncode == 0, child.stderr[-2000:]
    left = {p.name for p in temp.iterdir()} - {"fitjax-logs-notes"}
    assert (temp / "fitjax-logs-notes").is_dir() and len(left) == 1, left  # the uploaded one's is gone
    kept = temp / left.pop()
    assert f"the logs in {kept} did not reach {bucket}/stuck/version_0; kept there" in child.stderr
    assert (kept / "hparams.yaml").read_text() == "lr: 0.1\n"


_CLAIMS = textwrap.dedent("""
    import os, sys, time
    import fitjax as fj

    root, go = sys.argv[1], sys.argv[2]
    loggers = [fj.loggers.CSVLogger(root, name="runs") for _ in range(3)]
    print("ready", flush=True)
    while not os.path.exists(go):  # both processes claim at the same moment
        time.sleep(0.001)
    for logger in loggers:
        logger.claim_version()
        logger.log_hyperparams({"pid": int(sys.argv[3])})
        logger.finalize("success")
        print(logger.version, flush=True)
""")


def test_two_processes_started_at_once_under_one_s3_root_claim_a_version_each(bucket, tmp_path):
    # (by listing alone, as before, both processes took version_0, 1 and 2, each overwriting
    # the other's hparams.yaml)
    import fsspec

    root, go = f"{bucket}/claims", tmp_path / "go"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""}
    children = [subprocess.Popen([sys.executable, "-c", _CLAIMS, root, str(go), str(i)], env=env, text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE) for i in range(2)]
    for child in children:  # both imported fitjax and made their loggers
        assert child.stdout.readline().strip() == "ready", child.communicate()[1][-2000:]
    go.touch()
    outputs = [child.communicate(timeout=120) for child in children]
    assert all(child.returncode == 0 for child in children), [err[-2000:] for _, err in outputs]
    versions = [[int(v) for v in out.split()] for out, _ in outputs]
    assert sorted(versions[0] + versions[1]) == list(range(6))  # never one version for two runs
    fs, _ = fsspec.core.url_to_fs(root)
    assert listed(f"{root}/runs") == [f"version_{v}" for v in range(6)]
    for pid, mine in enumerate(versions):  # each folder holds its own run's files only
        for v in mine:
            assert fs.cat_file(f"{root}/runs/version_{v}/hparams.yaml").decode() == f"pid: {pid}\n"


class _Data(fj.DataModule):
    def train_dataloader(self):
        return fj.DataLoader(DATA, batch_size=16)


def test_cli_config_and_profiler_outputs_land_under_an_s3_root(bucket):
    import fsspec
    import yaml

    from fitjax.cli import LightningCLI

    root = f"{bucket}/cli"
    cli = LightningCLI(Regressor, _Data, args=["fit", f"--trainer.default_root_dir={root}", "--trainer.max_steps=3",
                                               "--trainer.profiler=simple", "--model.batchnorm=false",
                                               "--trainer.enable_progress_bar=false"])
    fs, _ = fsspec.core.url_to_fs(root)
    log_dir = f"{root}/fitjax_logs/version_0"
    assert cli.trainer.log_dir == log_dir
    saved = yaml.safe_load(fs.cat_file(f"{log_dir}/config.yaml"))
    assert saved["trainer"]["max_steps"] == 3 and saved["model"]["batchnorm"] is False
    report = fs.cat_file(f"{log_dir}/fit-profile.txt").decode()
    assert report.startswith("FIT profiler report") and "[step] dispatch" in report
    assert not Path(root.replace("://", ":/")).exists()  # nothing under a local 's3:/...' folder

    # JaxProfiler: the trace folder uploaded where TensorBoard's profile tab reads it
    profiler = fj.profilers.JaxProfiler(start_step=1, num_steps=1)
    trainer = quiet_trainer(max_steps=3, profiler=profiler, default_root_dir=f"{root}/jax")
    trainer.fit(Regressor(batchnorm=False), fj.DataLoader(DATA, batch_size=16))
    trace = str(profiler.trace_dir)
    assert trace.startswith(f"{root}/jax/") and "/plugins/profile/" in trace
    names = listed(trace)
    assert any(n.endswith(".xplane.pb") for n in names) and any(n.endswith(".trace.json.gz") for n in names)


def test_two_launched_processes_save_one_fsdp_state_to_s3_and_resume_last_bitwise(bucket, tmp_path):
    # each process stages its shards locally, uploads them, the two meet at a barrier and
    # process 0 writes .fitjax-complete last (launch_s3_fsdp.py: a straight 6-step fit, then
    # 3 steps saved to the store every step and a resume from "last" to step 6)
    import json

    url = f"{bucket}/fsdp"
    env = {**os.environ, "PYTHONPATH": str(HERE.parents[1])}
    proc = subprocess.run([sys.executable, "-m", "fitjax.cli", "launch", "--nproc", "2", "--devices-per-process", "4",
                           str(HERE / "launch_s3_fsdp.py"), url, str(tmp_path)], cwd=tmp_path, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-4000:]
    runs = json.loads((tmp_path / "runs.json").read_text())
    (straight_losses, straight_params), (resumed_losses, resumed_params) = runs["straight"], runs["resumed"]
    assert len(resumed_losses) == 6 and resumed_losses == straight_losses  # bitwise, step by step
    assert resumed_params == straight_params
    assert listed(url) == ["epoch=1-step=5", "epoch=1-step=6"]  # top 2 of the resumed run
    assert all(checkpoint.is_checkpoint(f"{url}/{name}") for name in listed(url))


def test_a_damaged_store_checkpoint_is_named_by_its_url_not_its_local_copy(bucket):
    import fsspec

    url = f"{bucket}/damaged"
    _fit([fj.ModelCheckpoint(url, every_n_train_steps=4, save_top_k=1)], max_epochs=1)
    fs, root = fsspec.core.url_to_fs(f"{url}/epoch=0-step=4")
    for name in fs.find(f"{root}/state"):  # every array file garbled, its size kept
        if "/d/" in name:
            fs.pipe_file(name, b"\xff" * fs.size(name))
    with pytest.raises(checkpoint.CheckpointDamaged, match=rf"^checkpoint '{url}/epoch=0-step=4' is damaged: state/"):
        checkpoint.verify(f"{url}/epoch=0-step=4")


def test_files_ending_in_line_breaks_land_whole(store_bucket, tmp_path):
    """Every byte of a file reaches the store, a last CR or LF included (the store's multipart
    parsing must not take a file's last CR for the boundary's line break)."""
    import fsspec

    from fitjax import _storage

    ends = {"cr": b"\r", "lf": b"\n", "crlf": b"\r\n", "cr-cr": b"\r\r", "none": b"x"}
    for name, end in ends.items():
        (tmp_path / name).write_bytes(os.urandom(64) + end)
    _storage.put_folder(tmp_path, _storage.as_path(f"{store_bucket}/ends"))
    fs = fsspec.filesystem(store_bucket.split(":")[0])
    for name in ends:
        assert fs.cat_file(f"{store_bucket}/ends/{name}") == (tmp_path / name).read_bytes(), name
