"""Two fits on one checkpoint folder, on local disk and on `s3://`: the second, started while the
first runs, is refused at start with an error naming the running fit (its pid and command), and
the first completes every save; once the first ends, the folder is free again. A killed fit's
lease does not hold the folder: on its machine it is dead at once and removed at the next start."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import Regressor, quiet_trainer, regression_data

import fitjax as fj
from fitjax import _storage, checkpoint
from fitjax.checkpoint import _lease

HERE = Path(__file__).resolve().parent
DATA = regression_data(n=64)

pytestmark = pytest.mark.usefixtures("compile_cache")  # tests/conftest.py


def _leases(folder: str) -> list[str]:
    path = _storage.as_path(folder)
    if _storage.is_url(path):
        return [n for n in _storage.names(path) if n.startswith(_lease.PREFIX)]
    return [p.name for p in Path(folder).glob(f"{_lease.PREFIX}*")] if Path(folder).is_dir() else []


def _first_fit(folder: str, tmp_path: Path) -> subprocess.Popen:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "", "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "xla"),
           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    child = subprocess.Popen([sys.executable, str(HERE / "two_fits_child.py"), folder], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while not _leases(folder):  # the first fit holds the folder
        assert child.poll() is None and time.monotonic() < deadline, child.communicate()[0][-3000:]
        time.sleep(0.2)
    return child


def _second_fit(folder: str) -> fj.Trainer:
    trainer = quiet_trainer(max_steps=2, enable_checkpointing=True,
                            callbacks=[fj.ModelCheckpoint(folder, every_n_train_steps=1, save_top_k=2)])
    trainer.fit(Regressor(batchnorm=False), fj.DataLoader(DATA, batch_size=16))
    return trainer


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_second_fit_on_a_folder_in_use_is_refused_and_the_first_saves_everything(where, tmp_path, request):
    folder = str(tmp_path / "ckpts") if where == "local" else f"{request.getfixturevalue('bucket')}/ckpts"
    first = _first_fit(folder, tmp_path)
    with pytest.raises(checkpoint.FolderInUse, match=rf"in use by another fit running now: pid {first.pid} on .*"
                                                      r"two_fits_child\.py"):
        _second_fit(folder)
    out = first.communicate(timeout=180)[0]
    assert first.returncode == 0 and "done" in out and "SaveFailed" not in out, out[-3000:]
    assert "last epoch=2-step=12" in out
    kept = checkpoint.checkpoints_newest_first([folder])
    assert kept and kept[0].name == "epoch=2-step=12"
    for path in kept:  # every checkpoint it kept reads back
        checkpoint.verify(path)
    assert _leases(folder) == []  # given back at its end: the folder is free
    assert _second_fit(folder).global_step == 2


def test_a_killed_fits_lease_is_dead_at_once_on_its_machine(tmp_path, caplog):
    folder = str(tmp_path / "ckpts")
    first = _first_fit(folder, tmp_path)
    first.send_signal(signal.SIGKILL)
    first.wait()
    (stale,) = _leases(folder)
    assert _second_fit(folder).global_step == 2  # not refused: its process is gone
    assert "the lease of a fit that is gone" in caplog.text and stale in caplog.text
    assert _leases(folder) == []
