"""Real object stores for the store tests, each started on 127.0.0.1 in a process of its own for
the test session, with one fresh bucket per test: moto's S3 server (`s3://`), and
gcp-storage-emulator's GCS JSON API (`gs://`), reached through the same s3fs/gcsfs a user's bucket is."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _server(what: str, command: list[str], port: int, environ: dict[str, str]):
    """Runs `command` (a server listening on `port`) until the session ends, with `environ` set
    in this process's environment, which subprocesses inherit, as a user sets it for a real store."""
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                proc.kill()
                pytest.fail(f"{what} did not start")
            time.sleep(0.2)
    saved = {k: os.environ.get(k) for k in environ}
    os.environ.update(environ)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(scope="session")
def s3_server():
    """The endpoint URL of a moto S3 server (credentials and endpoint set in the environment)."""
    port = _free_port()
    with _server("moto's S3 server", [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], port,
                 {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                  "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_DEFAULT_REGION": "us-east-1"}) as url:
        yield url


@pytest.fixture(scope="session")
def gcs_server():
    """The endpoint URL of a GCS emulator (`STORAGE_EMULATOR_HOST` set in the environment: gcsfs,
    like Google's own clients, then sends every request there, without credentials)."""
    port = _free_port()
    emulator = str(Path(__file__).with_name("gcs_emulator.py"))  # its uploads stored byte for byte
    with _server("gcp-storage-emulator", [sys.executable, emulator, "start", "--host", "127.0.0.1",
                                          "--port", str(port), "--in-memory", "--quiet"], port,
                 {"STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{port}"}) as url:
        yield url


@pytest.fixture
def bucket(s3_server):
    """`s3://<a new bucket>`."""
    import boto3

    name = f"fitjax-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_server).create_bucket(Bucket=name)
    return f"s3://{name}"


@pytest.fixture
def gs_bucket(gcs_server):
    """`gs://<a new bucket>`."""
    import fsspec

    name = f"fitjax-{uuid.uuid4().hex[:12]}"
    fsspec.filesystem("gs").mkdir(name)
    return f"gs://{name}"


@pytest.fixture(params=["s3", "gs"])
def store_bucket(request):
    """A new bucket on each store in turn: `s3://...`, then `gs://...`."""
    return request.getfixturevalue({"s3": "bucket", "gs": "gs_bucket"}[request.param])


@contextlib.contextmanager
def _proxied(upstream: str, variable: str, monkeypatch):
    from fault_proxy import FaultProxy

    from fitjax import _storage, checkpoint

    proxy = FaultProxy(upstream)
    monkeypatch.setenv(variable, proxy.url)
    try:
        yield proxy
    finally:
        proxy.rule = lambda method, path: "pass"
        proxy.release()
        checkpoint.writer().signalled(None)
        checkpoint.writer().drain()
        with contextlib.suppress(Exception):
            checkpoint.writer().raise_failure()  # a stalled save's failure, raised by its test already
        proxy.close()
        # the server's address again, and no filesystem made for the proxy's: a test after this
        # one that lists with fsspec before fitjax's next request would reach the closed proxy
        os.environ[variable] = upstream
        _storage._forget_filesystems()


@pytest.fixture
def proxy(s3_server, monkeypatch):
    """A `FaultProxy` in front of the S3 server, which this process's store requests go through
    (`AWS_ENDPOINT_URL`); afterwards it passes everything and the checkpoint writer finishes what
    it was doing before the proxy stops."""
    with _proxied(s3_server, "AWS_ENDPOINT_URL", monkeypatch) as proxy:
        yield proxy


@pytest.fixture
def gs_proxy(gcs_server, monkeypatch):
    """`proxy`, in front of the GCS emulator (`STORAGE_EMULATOR_HOST`)."""
    with _proxied(gcs_server, "STORAGE_EMULATOR_HOST", monkeypatch) as proxy:
        yield proxy
