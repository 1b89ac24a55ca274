"""fitjax deletes only what it can prove it wrote: a user's folders, another run's logs and
checkpoints, and foreign files next to (and around) a run's checkpoints survive it, on local disk,
an S3 store and a GCS one (servers on 127.0.0.1, tests/storage/conftest.py); what fitjax's own
interrupted writes left is removed, with a log line naming it."""

from __future__ import annotations

import pytest
from helpers import Regressor, quiet_trainer, regression_data

import fitjax as fj
from fitjax import _storage, checkpoint

# What a user, or another run, keeps where fitjax writes: at the root (the bucket itself, which is
# also the checkpoint folder), in the logger's folder, and in a version folder of another run.
PLANTED = {
    "data/train.csv": b"x,y\n1,2\n",
    "notes/ideas.md": b"# ideas\n",
    "notes/deep/more.txt": b"more",
    "foreign.txt": b"not fitjax's",
    "old-model/state/weights.bin": b"\x00\x01",  # looks like a checkpoint, is not fitjax's
    "old-model/commit_success.txt": b"done",
    "fitjax_logs/version_0/events.out.tfevents.1.host": b"tb",
    "fitjax_logs/version_0/hparams.yaml": b"lr: 0.1\n",
    "fitjax_logs/version_0/notes.txt": b"another run",
    "fitjax_logs/foreign.txt": b"foreign",
}


def _files(root, fs=None) -> dict[str, bytes]:
    if fs is None:
        return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}
    fs, base = fs
    fs.invalidate_cache()
    return {name[len(base):].lstrip("/"): fs.cat_file(name) for name in fs.find(base)}


def _plant(root, fs=None) -> None:
    for name, data in PLANTED.items():
        if fs is None:
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_bytes(data)
        else:
            fs[0].pipe_file(f"{fs[1]}/{name}", data)


@pytest.mark.parametrize("where", ["local", "s3", "gs"])
def test_a_fit_with_checkpoints_at_the_root_deletes_nothing_it_did_not_write(where, request, tmp_path, capsys):
    if where != "local":
        import fsspec

        root = request.getfixturevalue({"s3": "bucket", "gs": "gs_bucket"}[where])  # dirpath = default_root_dir = the bucket's root
        fs = fsspec.core.url_to_fs(root)
        _plant(None, fs)
        fs[0].pipe_file(f"{fs[1]}/epoch=0-step=9/{_storage.CLAIM}", b"")  # a killed fitjax upload's
        fs[0].pipe_file(f"{fs[1]}/epoch=0-step=9/state/_METADATA", b"{}")
        leftover = f"{root}/epoch=0-step=9"
    else:
        root, fs = tmp_path / "run", None
        _plant(root)
        (root / f"epoch=0-step=9{checkpoint.TMP_MARK}-123" / "state").mkdir(parents=True)  # Orbax's
        leftover = str(root / f"epoch=0-step=9{checkpoint.TMP_MARK}-123")
    base = root if fs is None else None

    trainer = quiet_trainer(max_steps=4, log_every_n_steps=1, default_root_dir=str(root), enable_checkpointing=True,
                            logger=fj.TensorBoardLogger(str(root)),
                            callbacks=[fj.ModelCheckpoint(str(root), every_n_train_steps=1, save_top_k=2)])
    trainer.fit(Regressor(batchnorm=False), fj.DataLoader(regression_data(n=64), batch_size=16))

    after = _files(base, fs)
    assert {name: after.get(name) for name in PLANTED} == PLANTED  # every one survives, unchanged
    kept = sorted({name.split("/")[0] for name in after if name.startswith("epoch=")})
    assert kept == ["epoch=0-step=3", "epoch=0-step=4"]  # its own: top 2 kept, the leftover removed
    assert all(checkpoint.is_checkpoint(f"{root}/{name}") for name in kept)
    assert f"fitjax: removing {leftover}," in capsys.readouterr().out  # fitjax's log lines print there
    assert "fitjax_logs/version_1/hparams.yaml" in after  # the logger took the next version
