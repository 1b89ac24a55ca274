"""A real S3-compatible server for the store tests: moto's server mode on 127.0.0.1, started in a
process of its own for the test session, and one fresh bucket per test."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import uuid

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def s3_server():
    """The endpoint URL of a moto S3 server (credentials and endpoint set in the environment,
    which subprocesses inherit, as a user sets them for a real store)."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                proc.kill()
                pytest.fail("moto's S3 server did not start")
            time.sleep(0.2)
    url = f"http://127.0.0.1:{port}"
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL",
                                            "AWS_DEFAULT_REGION")}
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_ENDPOINT_URL=url,
                      AWS_DEFAULT_REGION="us-east-1")
    try:
        yield url
    finally:
        proc.kill()
        proc.wait()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture
def bucket(s3_server):
    """`s3://<a new bucket>`."""
    import boto3

    name = f"fitjax-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_server).create_bucket(Bucket=name)
    return f"s3://{name}"


@pytest.fixture
def proxy(s3_server, monkeypatch):
    """A `FaultProxy` in front of the S3 server, which this process's store requests go through
    (`AWS_ENDPOINT_URL`); afterwards it passes everything and the checkpoint writer finishes what
    it was doing before the proxy stops."""
    from fault_proxy import FaultProxy

    from fitjax import checkpoint

    proxy = FaultProxy(s3_server)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
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
