"""8 virtual CPU devices for every test: set before JAX is imported anywhere.

No `JAX_PLATFORMS` is set: the suite runs as users run, with whatever `[dev]` installed (libtpu
among them, kept from probing by `import fitjax` on a machine without a TPU).
"""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()

import fitjax  # noqa: E402,F401  (first: it picks XLA:CPU's scheduler before the backends start)
import jax  # noqa: E402
import pytest  # noqa: E402
from helpers import persistent_compile_cache  # noqa: E402

assert "--xla_cpu_enable_concurrency_optimized_scheduler=false" in os.environ["XLA_FLAGS"]
assert len(jax.devices("cpu")) == 8, "conftest must run before anything imports jax"


# One of each session fixture per test run, also under `pytest -n 2 --dist loadgroup` (README's
# command): the tests that use one run on the same worker, which starts it once.
# A test parametrized over the stores ("s3", "gs": tests/storage/conftest.py's `store_bucket`, or a
# parameter that picks a bucket fixture by that name) joins the group of that store's server.
_SESSION_FIXTURES = ("slurm", "site", "s3_server", "gcs_server")
_STORE_SERVERS = {"s3": "s3_server", "gs": "gcs_server"}


def pytest_collection_modifyitems(items):
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        shared = [_STORE_SERVERS[value] for value in params.values() if isinstance(value, str) and value in _STORE_SERVERS]
        shared += [name for name in _SESSION_FIXTURES if name in getattr(item, "fixturenames", ())]
        if shared:
            item.add_marker(pytest.mark.xdist_group(shared[0]))


@pytest.fixture(scope="module")
def compile_cache(tmp_path_factory):
    """XLA's persistent cache for one test module (a fresh folder): each program its fits build
    again and again is compiled once. A module opts in with
    `pytestmark = pytest.mark.usefixtures("compile_cache")`."""
    with persistent_compile_cache(tmp_path_factory.mktemp("xla_cache")):
        yield
