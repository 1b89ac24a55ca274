"""A checkpoint from a bucket or folder someone else can write to cannot make fitjax write outside
its download cache: a crafted `.fitjax-complete` (escaping or absolute names, an absolute or
escaping `id`, names that are not plain paths) and a crafted `ModelCheckpoint` state (paths
outside its folder) are refused with `CheckpointDamaged` naming the entry, before anything is
written: a sentinel file outside the cache keeps its bytes and its modification time."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers import Regressor, quiet_trainer, regression_data

import fitjax as fj
from fitjax import _storage, checkpoint

DATA = regression_data(n=32)
SENTINEL = b"the user's own file\n"

pytestmark = pytest.mark.usefixtures("compile_cache")  # tests/conftest.py


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """One real local checkpoint (a 1-step fit), uploaded by each test as it needs."""
    root = tmp_path_factory.mktemp("saved")
    trainer = quiet_trainer(max_epochs=1, enable_checkpointing=True,
                            callbacks=[fj.ModelCheckpoint(str(root), every_n_train_steps=1)])
    trainer.fit(Regressor(batchnorm=False), fj.DataLoader(DATA, batch_size=32))
    return Path(trainer.checkpoint_callback.last_model_path)


@pytest.fixture
def sentinel(tmp_path) -> Path:
    file = tmp_path / "outside" / "victim.txt"
    file.parent.mkdir()
    file.write_bytes(SENTINEL)
    os.utime(file, ns=(1_000_000_000_000_000_000, 1_000_000_000_000_000_000))
    return file


def _unchanged(file: Path) -> None:
    assert file.read_bytes() == SENTINEL
    assert file.stat().st_mtime_ns == 1_000_000_000_000_000_000
    assert sorted(p.name for p in file.parent.iterdir()) == ["victim.txt"]


def _crafted(saved: Path, url: str, record: dict, extra: dict[str, bytes] | None = None) -> None:
    """A complete-looking store checkpoint at `url`: the real files, `record` as its
    `.fitjax-complete`, and `extra` objects (key under `url` -> bytes, kept as given)."""
    import fsspec

    target = _storage.as_path(url)
    _storage.begin(target)
    files = _storage.put_folder(saved, target)
    fs, root = fsspec.core.url_to_fs(url)
    for key, data in (extra or {}).items():
        fs.pipe_file(f"{root}/{key}", data)
    fs.pipe_file(f"{root}/{_storage.COMPLETE}", json.dumps({"files": files, **record}).encode())


def _cached_names() -> set[str]:
    cache = _storage._cache()
    return {str(p.relative_to(cache)) for p in cache.rglob("*")}


def _escaping(sentinel: Path, url: str, upload_id: str) -> str:
    """The name that, joined to where the download of `url` would land, is `sentinel`."""
    landing = _storage._cache() / upload_id / url.rsplit("/", 1)[-1]
    return os.path.relpath(sentinel, landing)


GOOD_ID = "0123456789abcdef0123456789abcdef"


def _cases(sentinel: Path, url: str) -> dict[str, tuple[dict, str]]:
    """name -> (what the record holds over the real one, what the error names)."""
    escape = _escaping(sentinel, url, GOOD_ID)
    return {
        "escaping name": ({"id": GOOD_ID, "files": {escape: len(SENTINEL)}}, "climbs out"),
        "absolute name": ({"id": GOOD_ID, "files": {str(sentinel): len(SENTINEL)}}, "absolute path"),
        "absolute id": ({"id": str(sentinel.parent)}, "not a checkpoint id"),
        "escaping id": ({"id": "../" * 8 + str(sentinel.parent).lstrip("/")}, "not a checkpoint id"),
        "dotted name": ({"id": GOOD_ID, "files": {"state/./../../x": 1}}, "climbs out"),
        "backslashed name": ({"id": GOOD_ID, "files": {"state\\..\\..\\x": 1}}, "backslashes"),
        "home name": ({"id": GOOD_ID, "files": {"~/victim.txt": 1}}, "absolute path"),
        "marker name": ({"id": GOOD_ID, "files": {_storage.COMPLETE: 1}}, "fitjax's own marker"),
    }


@pytest.mark.parametrize("case", ["escaping name", "absolute name", "absolute id", "escaping id", "dotted name",
                                  "backslashed name", "home name", "marker name"])
def test_a_crafted_store_record_is_refused_and_nothing_is_written(store_bucket, saved, sentinel, case):
    url = f"{store_bucket}/shared/epoch=0-step=1"
    record, named = _cases(sentinel, url)[case]
    extra = {}
    if case == "escaping name" and url.startswith("s3://"):  # the object it names is there: S3 keeps
        # `..` in keys (the GCS emulator refuses such a name)
        extra = {name: b"attacker's bytes" for name in record["files"]}
    _crafted(saved, url, record, extra)
    before = _cached_names()

    for load in (lambda: Regressor.load_from_checkpoint(url, batchnorm=False),
                 lambda: checkpoint.verify(url)):
        with pytest.raises(checkpoint.CheckpointDamaged, match=named) as caught:
            load()
        assert str(caught.value).startswith(f"checkpoint {url!r} is damaged: ")
        _unchanged(sentinel)
        assert _cached_names() == before  # nothing downloaded, not even the safe files


def test_resuming_last_from_a_crafted_store_folder_is_refused(bucket, saved, sentinel):
    url = f"{bucket}/shared"
    _crafted(saved, f"{url}/epoch=0-step=1", {"id": str(sentinel.parent)})
    trainer = quiet_trainer(max_epochs=2, enable_checkpointing=True, callbacks=[fj.ModelCheckpoint(url)])
    with pytest.raises(checkpoint.CheckpointDamaged, match="not a checkpoint id"):
        trainer.fit(Regressor(batchnorm=False), fj.DataLoader(DATA, batch_size=32), ckpt_path="last")
    _unchanged(sentinel)


def _with_saved_state(saved: Path, into: Path, **changes) -> Path:
    """A copy of `saved` in `into` whose ModelCheckpoint state has `changes`."""
    import shutil

    copy = into / saved.name
    shutil.copytree(saved, copy)
    meta_file = copy / checkpoint.META_ITEM / "metadata"
    meta = json.loads(meta_file.read_text())
    (state,) = meta["callbacks"].values()
    state.update(dirpath=str(into), best_model_path=str(copy), last_model_path=str(copy), kept=[[str(copy), None]])
    state.update(changes)
    meta_file.write_text(json.dumps(meta))
    return copy


@pytest.mark.parametrize("entry", ["kept", "best_model_path", "last_model_path", "dirpath"])
def test_a_saved_model_checkpoint_state_naming_paths_elsewhere_is_refused(tmp_path, saved, sentinel, entry):
    """Top-k deletes what the saved state lists as kept: a crafted state listing another folder's
    checkpoint (here a real one) would delete it; "best" would read it."""
    import shutil

    other = sentinel.parent / "precious"
    shutil.copytree(saved, other)
    into = tmp_path / "ckpts"
    into.mkdir()
    changes = {"kept": [[str(other), 0.0]], "best_model_path": str(other), "last_model_path": str(other),
               "dirpath": str(into) + "/../outside"}
    crafted = _with_saved_state(saved, into, **{entry: changes[entry]})
    cb = fj.ModelCheckpoint(str(into), every_n_train_steps=1, save_top_k=1)
    trainer = quiet_trainer(max_epochs=3, enable_checkpointing=True, callbacks=[cb])
    with pytest.raises(checkpoint.CheckpointDamaged, match=rf"ModelCheckpoint's saved '{entry}'"):
        trainer.fit(Regressor(batchnorm=False), fj.DataLoader(DATA, batch_size=32), ckpt_path=str(crafted))
    assert checkpoint.is_checkpoint(other)
    assert (sentinel.read_bytes(), sentinel.stat().st_mtime_ns) == (SENTINEL, 1_000_000_000_000_000_000)
