"""A lease never blocks a folder for ever: stale after its heartbeat timeout whatever its pid
(a pid reused by another process), a heartbeat from the future named as clock skew and stale
once it is the timeout ahead, and the refusal says how long the wait is (issue 61, "Why" 6)."""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import time

import pytest

from fitjax import checkpoint
from fitjax.checkpoint import _lease


def _crafted(folder, *, host: str, beat_in: float, pid: int | None = None) -> str:
    """A lease another fit wrote: on `host`, its last heartbeat `beat_in` seconds from now
    (below 0: ago), its process `pid` (a live one: this test's parent)."""
    folder.mkdir(exist_ok=True)
    name = f"{_lease.PREFIX}{host}-1"
    record = {"host": host, "pid": os.getppid() if pid is None else pid, "started": time.time() - 4000,
              "command": "python train.py", "beat": time.time() + beat_in}
    (folder / name).write_text(json.dumps(record))
    return name


@pytest.fixture
def folder(tmp_path):
    yield tmp_path / "ckpts"
    checkpoint.release_folder(tmp_path / "ckpts")


def _taken_over(folder, stale: str, caplog) -> str:
    with caplog.at_level(logging.WARNING, logger="fitjax"):
        checkpoint.hold_folder(folder)  # not refused
    assert not (folder / stale).exists()
    return caplog.text


def test_a_lease_on_this_machine_whose_pid_lives_on_is_stale_after_the_timeout(folder, caplog):
    # the fit was killed long ago and its pid now belongs to another process (here: a live one)
    stale = _crafted(folder, host=socket.gethostname(), beat_in=-3001)
    said = _taken_over(folder, stale, caplog)
    limit = _lease.stale_after()  # 180 s by default: four beats and the store's timeout
    assert re.search(rf"removing .*{stale}.*no heartbeat for 3001 s \(a lease is stale after {limit:.0f} s\)", said), said


def test_a_heartbeat_far_in_the_future_is_named_clock_skew_and_taken_as_stale(folder, caplog):
    stale = _crafted(folder, host="other-machine", beat_in=86400)
    said = _taken_over(folder, stale, caplog)
    assert re.search(r"stamped 86400 s in the future: the clock of other-machine and this machine's disagree "
                     r"\(clock skew\)", said), said


def test_a_refusal_says_how_long_the_wait_is_and_names_a_clock_ahead(folder):
    limit = _lease.stale_after()
    _crafted(folder, host="other-machine", beat_in=-30)  # a live fit elsewhere, last heard 30 s ago
    with pytest.raises(checkpoint.FolderInUse, match=rf"last heard from 30 s ago.*If it was killed, the folder is "
                                                     rf"free in {limit - 30:.0f} s, at \d\d:\d\d:\d\d, {limit:.0f} s "
                                                     "after its last"):
        checkpoint.hold_folder(folder)
    _crafted(folder, host="other-machine", beat_in=60)  # its clock a minute ahead of ours
    with pytest.raises(checkpoint.FolderInUse, match=r"stamped 60 s in the future \(the clock of other-machine runs "
                                                     rf"ahead of this machine's: clock skew\).*free in {limit + 60:.0f} s"):
        checkpoint.hold_folder(folder)
