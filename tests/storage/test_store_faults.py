"""A store that is slow, drops connections, or never answers (a fault proxy on 127.0.0.1 in front
of moto's S3 server or the GCS emulator, tests/storage/fault_proxy.py): saves retry through short outages, a stall
ends with an error naming the URL and the operation within its bound, a failed deletion is a
warning and the saves after it go on, and SIGTERM is acted on while a save waits."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from helpers import Regressor, quiet_trainer, regression_data

import fitjax as fj
from fitjax import checkpoint
from fitjax.checkpoint import _writer

# the same small programs, fit after fit: compiled once (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("compile_cache")

DATA = regression_data(n=64)  # 4 batches of 16 an epoch


class _AtStep(fj.Callback):
    """Runs `action()` once, at the end of train step `step`."""

    def __init__(self, step: int, action) -> None:
        self.step, self.action = step, action

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            self.action()


def _fit(url: str, *, max_steps: int, top_k: int = -1, extra=()) -> fj.Trainer:
    trainer = quiet_trainer(max_steps=max_steps, enable_checkpointing=True, callbacks=[
        *extra, fj.ModelCheckpoint(url, every_n_train_steps=1, save_top_k=top_k)])
    trainer.fit(Regressor(batchnorm=False), fj.DataLoader(DATA, batch_size=16))
    return trainer


@pytest.mark.parametrize("store", ["s3", "gs"])
def test_an_outage_shorter_than_the_timeout_is_retried_and_every_save_lands(store, request, monkeypatch):
    # on gs, fitjax's retries are the only ones (gcsfs's own are off: `_storage._one_attempt`)
    proxy = request.getfixturevalue({"s3": "proxy", "gs": "gs_proxy"}[store])
    bucket = request.getfixturevalue({"s3": "bucket", "gs": "gs_bucket"}[store])
    monkeypatch.setenv("FITJAX_STORE_TIMEOUT", "20")
    url = f"{bucket}/outage"
    until = []

    def outage(method, path):  # every request dropped for 2 s from the end of step 2
        return "drop" if until and time.monotonic() < until[0] else "pass"

    proxy.rule = outage
    _fit(url, max_steps=4, extra=[_AtStep(2, lambda: until.append(time.monotonic() + 2.0))])
    assert sum(what == "drop" for _, _, what in proxy.seen) >= 2  # the outage was met, and retried
    for step in (1, 2, 3, 4):
        checkpoint.verify(f"{url}/epoch={(step - 1) // 4}-step={step}")


def test_a_store_that_never_answers_ends_the_fit_naming_the_url_and_operation(proxy, bucket, monkeypatch):
    monkeypatch.setenv("FITJAX_STORE_TIMEOUT", "3")
    url = f"{bucket}/stalled"
    proxy.rule = lambda method, path: "dead" if method == "PUT" and "-step=2/" in path else "pass"
    start = time.monotonic()
    with pytest.raises(checkpoint.SaveFailed) as error:
        _fit(url, max_steps=4)
    assert time.monotonic() - start < 60
    message = str(error.value)
    assert f"{url}/epoch=0-step=2" in message and "did not complete within 3 s" in message
    assert "writing .fitjax-checkpoint" in message and "FITJAX_STORE_TIMEOUT" in message
    assert checkpoint.latest_checkpoint([url]) == checkpoint.local_path(f"{url}/epoch=0-step=1")


def test_a_gcs_store_that_stops_answering_ends_the_fit_within_its_bound(gs_proxy, gs_bucket, monkeypatch):
    # gcsfs tries each request 6 times, sleeping 1 to 16 s between: left on, this stall would
    # take 6 x 3 s + 31 s to end; fitjax's bound is one request's timeout, then `_call`'s clock
    monkeypatch.setenv("FITJAX_STORE_TIMEOUT", "3")
    url = f"{gs_bucket}/stalled"
    stalled = []

    def stall() -> None:  # from the save at step 2 on: every upload left unanswered
        checkpoint.writer().drain()  # the save at step 1 is on the store
        stalled.append(time.monotonic())

    gs_proxy.rule = lambda method, path: "dead" if stalled and method == "POST" else "pass"
    with pytest.raises(checkpoint.SaveFailed) as error:
        _fit(url, max_steps=4, extra=[_AtStep(2, stall)])
    assert time.monotonic() - stalled[0] < 15
    message = str(error.value)
    assert f"{url}/epoch=0-step=2" in message and "did not complete within 3 s" in message
    assert "writing .fitjax-checkpoint" in message and "FITJAX_STORE_TIMEOUT" in message
    assert checkpoint.latest_checkpoint([url]) == checkpoint.local_path(f"{url}/epoch=0-step=1")


def test_a_failed_deletion_is_a_warning_and_the_saves_after_it_go_on(proxy, bucket, monkeypatch):
    monkeypatch.setenv("FITJAX_STORE_TIMEOUT", "2")
    url = f"{bucket}/undeletable"
    proxy.rule = lambda method, path: "drop" if method == "DELETE" and "-step=" in path else "pass"
    with pytest.warns(UserWarning, match=r"could not delete '.*epoch=0-step=1'.*It stays"):
        trainer = _fit(url, max_steps=3, top_k=1)
    assert trainer.checkpoint_callback.last_model_path.endswith("epoch=0-step=3")
    for step in (1, 2, 3):  # the deletions failed before touching anything: all still complete
        checkpoint.verify(f"{url}/epoch=0-step={step}")


def test_sigterm_while_a_save_waits_on_a_stalled_store_ends_the_fit(proxy, bucket, monkeypatch):
    monkeypatch.setenv("FITJAX_STORE_TIMEOUT", "60")  # the store's own bound is far away
    monkeypatch.setattr(_writer, "SIGNAL_GRACE", 1.0)
    url = f"{bucket}/sigterm"
    stalled = []

    def rule(method, path):  # the save at step 2 never answered; SIGTERM soon after it stalls
        if method == "PUT" and "-step=2/" in path:
            if not stalled:
                threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM)).start()
            stalled.append(path)
            return "dead"
        return "pass"

    proxy.rule = rule
    start = time.monotonic()
    trainer = quiet_trainer(max_steps=6, enable_checkpointing=True,
                            callbacks=[fj.ModelCheckpoint(url, every_n_train_steps=1, save_top_k=-1)])
    try:
        trainer.fit(Regressor(batchnorm=False), fj.DataLoader(DATA, batch_size=16))
    except checkpoint.SaveFailed as error:
        assert "SIGTERM received while waiting for the save of" in str(error)
        assert f"writing .fitjax-checkpoint of '{url}/epoch=0-step=2' has not answered for" in str(error)
    else:
        pytest.fail(f"fit returned at step {trainer.global_step}; stalled requests: {stalled}")
    assert time.monotonic() - start < 30


def _multipart_upload(method: str, path: str) -> bool:
    return method == "POST" and "uploadType=multipart" in path  # gcsfs's upload of a file under 5 MiB


def test_a_file_the_store_keeps_short_is_uploaded_again_and_every_save_lands(gs_proxy, gs_bucket):
    # a store that keeps one file a byte short (the GCS emulator did so for files ending in CR)
    url = f"{gs_bucket}/short"
    armed, posts = [], []

    def rule(method, path):  # step 2's save: its first file (after its claim) is kept short, once
        if armed and _multipart_upload(method, path):
            posts.append(path)
            return "truncate" if len(posts) == 2 else "pass"
        return "pass"

    gs_proxy.rule = rule
    _fit(url, max_steps=4, extra=[_AtStep(2, lambda: checkpoint.writer().drain() or armed.append(True))])
    assert len(posts) > 2  # a file landed short, was found in the listing and uploaded again
    for step in (1, 2, 3, 4):
        checkpoint.verify(f"{url}/epoch=0-step={step}")


def test_a_store_that_keeps_files_short_fails_the_save_and_marks_nothing_complete(gs_proxy, gs_bucket):
    url = f"{gs_bucket}/always-short"
    armed = []
    gs_proxy.rule = lambda method, path: "truncate" if armed and _multipart_upload(method, path) else "pass"
    with pytest.raises(checkpoint.SaveFailed) as error:
        _fit(url, max_steps=4, extra=[_AtStep(2, lambda: checkpoint.writer().drain() or armed.append(True))])
    message = str(error.value)
    assert f"{url}/epoch=0-step=2" in message and "the store holds" in message, message
    assert "uploaded, twice" in message and "not marked complete" in message, message
    assert checkpoint.latest_checkpoint([url]) == checkpoint.local_path(f"{url}/epoch=0-step=1")


def test_a_connection_drop_at_fit_start_is_ridden_through(proxy, bucket, monkeypatch):
    """Every request dropped for 3 s from the fit's first one (the logger's version claim), and
    again from its checkpoint folder's write probe and from its lease: each start-up request is
    retried as a save's are, and the fit trains and saves."""
    monkeypatch.setenv("FITJAX_STORE_TIMEOUT", "20")
    windows: dict[str, float] = {}  # what opened a 3 s outage (the first request with it) -> its end

    def outage(method, path):
        now = time.monotonic()
        for trigger in ("", ".fitjax-write-probe-", ".fitjax-lease-"):
            if trigger in path and trigger not in windows:
                windows[trigger] = now + 3.0
        return "drop" if any(now < end for end in windows.values()) else "pass"

    root = f"{bucket}/start"
    trainer = quiet_trainer(max_steps=2, enable_checkpointing=True, default_root_dir=root,
                            logger=fj.CSVLogger(root), callbacks=[fj.ModelCheckpoint(every_n_train_steps=1)])
    proxy.rule = outage
    trainer.fit(Regressor(batchnorm=False), fj.DataLoader(DATA, batch_size=16))
    assert set(windows) == {"", ".fitjax-write-probe-", ".fitjax-lease-"}  # each outage was met
    assert sum(what == "drop" for _, _, what in proxy.seen) >= 6  # and retried through
    assert trainer.global_step == 2
    checkpoint.verify(trainer.checkpoint_callback.last_model_path)
