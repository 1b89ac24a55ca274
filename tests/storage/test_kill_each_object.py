"""A writer killed with SIGKILL at *each* object of a checkpoint's upload, and of its deletion,
on an S3 store (moto's server on 127.0.0.1 behind a fault proxy, tests/storage/conftest.py):
whatever the kill leaves, no name under the folder passes for a checkpoint unless it loads,
`"last"` resolves to the newest complete one, and the next writer's start-up clean-up removes
the torn prefix and nothing else (a user's files next to it survive).

The killed process is a real one running fitjax's own upload and deletion (`fitjax._storage`,
what the checkpoint writer thread calls for a store folder) on a real Orbax checkpoint, forked
from one that imported fitjax (tests/storage/preloaded.py); the proxy kills it as it sends the
k-th object, before the store gets it. tests/storage/test_s3.py kills
whole fits (at two points of a save) and resumes them."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest
from helpers import Regressor, quiet_trainer, regression_data
from preloaded import Preloaded
from store_parts import listed

import fitjax as fj
from fitjax import _storage, checkpoint

USER_FILE = "notes/ideas.md"  # a user's file in the checkpoint folder: never deleted

_CHILD = textwrap.dedent("""
    from pathlib import Path
    from fitjax import _storage
    _storage.{what}
    print("not killed")
""")


@pytest.fixture
def forks(proxy):
    """Children forked from one process that imported fitjax once (~20 of them here, each a fresh
    `python -c` paid ~2.5 s of CPU for the import), with the proxy's address in their environment."""
    with Preloaded("fitjax._storage", {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""}) as forks:
        yield forks


def _saved(tmp_path: Path) -> list[Path]:
    """Two real checkpoints on local disk: `epoch=0-step=1`, `epoch=0-step=2`."""
    folder = tmp_path / "saved"
    trainer = quiet_trainer(max_steps=2, enable_checkpointing=True,
                            callbacks=[fj.ModelCheckpoint(folder, every_n_train_steps=1, save_top_k=-1)])
    trainer.fit(Regressor(batchnorm=False), fj.DataLoader(regression_data(n=32), batch_size=16))
    return sorted(folder.iterdir())


def _killed_at(proxy, forks, what: str, counted, k: int) -> list[str]:
    """Runs `_storage.<what>` in a child process and SIGKILLs it when it sends its `k`-th request
    that `counted(method, path)` counts, which the store then never gets. Returns the counted
    requests it sent (the last one dropped)."""
    _, _, sent = proxy.kill_child(lambda: forks.start(_CHILD.format(what=what)), None,
                                  lambda method, path: f"{method} {path}" if counted(method, path) else None,
                                  lambda sent: len(sent) == k, timeout=120)
    return sent


def _only_complete_names_and_cleanup_removes_the_rest(url: str, kept: str, torn: str) -> None:
    """After a kill: `kept` loads, `torn` is a checkpoint only if it loads, `"last"` is the newest
    complete one, and the start-up clean-up removes `torn` if it is not (naming it) and nothing else."""
    before = listed(url)
    checkpoint.verify(f"{url}/{kept}")
    complete = checkpoint.is_checkpoint(f"{url}/{torn}")
    if complete:
        checkpoint.verify(f"{url}/{torn}")
    newest = torn if complete else kept
    assert checkpoint.latest_checkpoint([url]) == checkpoint.local_path(f"{url}/{newest}")
    removed = checkpoint.cleanup(_storage.as_path(url))
    expected = sorted({kept, "notes"} | ({torn} if complete else set()))
    assert listed(url) == expected
    assert [p.name for p in removed] == ([] if complete or torn not in before else [torn])


def test_a_kill_at_each_object_of_an_upload_or_a_deletion_leaves_only_loadable_checkpoints(proxy, forks, bucket,
                                                                                          tmp_path):
    import fsspec

    first, second = _saved(tmp_path)
    url = f"{bucket}/ckpts"
    fs, root = fsspec.core.url_to_fs(url)
    fs.pipe_file(f"{root}/{USER_FILE}", b"# ideas\n")
    _storage.upload(first, _storage.as_path(f"{url}/{first.name}"))
    objects = 2 + sum(1 for p in second.rglob("*") if p.is_file())  # the claim, the files, the marker
    assert objects >= 5

    upload = f"upload(Path({str(second)!r}), _storage.as_path({url + '/' + second.name!r}))"
    puts = lambda method, path: method == "PUT" and f"/{second.name}/" in path
    for k in range(1, objects + 1):
        sent = _killed_at(proxy, forks, upload, puts, k)
        assert len(sent) == k  # killed at its k-th object, in order: claim, files, marker
        if k == 1:
            assert sent[0].endswith(f"/{_storage.CLAIM}")
        if k == objects:
            assert sent[-1].endswith(f"/{_storage.COMPLETE}")
        assert (second.name in listed(url)) == (k > 1)  # the claim is up from the second object on
        assert not checkpoint.is_checkpoint(f"{url}/{second.name}")
        _only_complete_names_and_cleanup_removes_the_rest(url, first.name, second.name)

    # the same checkpoint uploaded whole, then its deletion killed at each of its requests
    # (the marker's DELETE, the files' bulk delete, the claim's DELETE)
    deletion = f"remove(_storage.as_path({url + '/' + second.name!r}))"
    deletes = lambda method, path: method == "DELETE" or (method == "POST" and "delete" in path)
    for k in range(1, 4):
        _storage.upload(second, _storage.as_path(f"{url}/{second.name}"))
        assert checkpoint.is_checkpoint(f"{url}/{second.name}")
        sent = _killed_at(proxy, forks, deletion, deletes, k)
        # the marker goes first: from the first request on the checkpoint is no longer complete
        # only when the store got that request (k > 1)
        assert checkpoint.is_checkpoint(f"{url}/{second.name}") == (k == 1), sent
        _only_complete_names_and_cleanup_removes_the_rest(url, first.name, second.name)
        if k == 1:  # still complete: deleted for the next round
            _storage.remove(_storage.as_path(f"{url}/{second.name}"))
    assert fs.cat_file(f"{root}/{USER_FILE}") == b"# ideas\n"
