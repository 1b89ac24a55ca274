"""8 virtual CPU devices for every test: set before JAX is imported anywhere.

No `JAX_PLATFORMS` is set: the suite runs as users run, with whatever `[dev]` installed (libtpu
among them, kept from probing by `import fitjax` on a machine without a TPU).
"""

import atexit
import faulthandler
import os
import shutil
import tempfile
from pathlib import Path

# fitjax's compile cache (`Trainer(compile_cache=True)`, the default) goes to a folder of this
# test run, as a user would move it: the suite never writes into the real ~/.cache, and a program
# stored by an earlier run is never read back. The test processes' subprocesses inherit it.
if os.environ.get("FITJAX_COMPILE_CACHE", "").strip().lower() not in ("0", "false", "no", "off"):
    os.environ["FITJAX_COMPILE_CACHE"] = tempfile.mkdtemp(prefix="fitjax-test-xla-")
    atexit.register(shutil.rmtree, os.environ["FITJAX_COMPILE_CACHE"], True)

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()

import fitjax  # noqa: E402,F401  (first: it picks XLA:CPU's scheduler before the backends start)
import jax  # noqa: E402
import pytest  # noqa: E402
from helpers import persistent_compile_cache  # noqa: E402

assert "--xla_cpu_enable_concurrency_optimized_scheduler=false" in os.environ["XLA_FLAGS"]
assert len(jax.devices("cpu")) == 8, "conftest must run before anything imports jax"


# One of each session fixture per test run, also under `pytest -n 4 --dist loadgroup` (README's
# command): the tests that use one run on the same worker, which starts it once.
# A test parametrized over the stores ("s3", "gs": tests/storage/conftest.py's `store_bucket`, or a
# parameter that picks a bucket fixture by that name) joins the group of that store's server.
_SESSION_FIXTURES = ("slurm", "site", "s3_server", "gcs_server")
_STORE_SERVERS = {"s3": "s3_server", "gs": "gcs_server"}


# Likewise a module's tests that share a module-scoped fixture (a reference run, two launched
# processes, the module's compile cache) run on one worker, which sets it up once: split over
# both, each worker ran it (two_processes' two fits of 2 processes: ~30 s each, twice).


def _module_scoped(item) -> bool:
    defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    return any(chain[-1].scope in ("module", "package", "class") for chain in defs.values() if chain)


def _join_group(item, group: str, loadgroup: bool) -> None:
    """Marks `item` for xdist's group `group`. xdist's scheduler reads a test's group from its id
    ("<id>@<group>"), which xdist 3.8's worker writes to `item._nodeid`; pytest 9 derives the id
    from `item._id` instead, so there the worker's renaming is lost and every group was split over
    both workers (each worker started the servers and ran the module fixtures): the id is set here."""
    if item.get_closest_marker("xdist_group") is None:
        item.add_marker(pytest.mark.xdist_group(group))
    if loadgroup and hasattr(item, "_id") and "@" not in item.nodeid:  # pytest >= 9
        from _pytest.nodeid import coerce_node_id

        item._id = coerce_node_id(f"{item.nodeid}@{group}")


@pytest.hookimpl(tryfirst=True)  # before xdist's worker reads the groups into the test ids
def pytest_collection_modifyitems(config, items):
    loadgroup = bool(config.getvalue("loadgroup")) if hasattr(config.option, "loadgroup") else False
    groups, modules = {}, {}  # a test's session fixture's group; a module's first such group
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        shared = [_STORE_SERVERS[value] for value in params.values() if isinstance(value, str) and value in _STORE_SERVERS]
        shared += [name for name in _SESSION_FIXTURES if name in getattr(item, "fixturenames", ())]
        marked = item.get_closest_marker("xdist_group")  # a test module's own group
        if marked:
            shared.insert(0, marked.args[0] if marked.args else marked.kwargs.get("name", "default"))
        if shared:
            groups[item] = shared[0]
            modules.setdefault(item.nodeid.split("::")[0], shared[0])
    for item in items:
        module = item.nodeid.split("::")[0]
        group = groups.get(item) or (modules.get(module, module) if _module_scoped(item) else None)
        if group:  # a module fixture's tests go where the module's session-fixture tests go
            _join_group(item, group, loadgroup)


@pytest.fixture(scope="module")
def compile_cache(tmp_path_factory):
    """XLA's persistent cache for one test module (a fresh folder): each program its fits build
    again and again is compiled once. A module opts in with
    `pytestmark = pytest.mark.usefixtures("compile_cache")`."""
    with persistent_compile_cache(tmp_path_factory.mktemp("xla_cache")):
        yield


# A test worker that dies (xdist: "node down: Not properly terminated") says only which test it
# was running. Each worker writes Python's traceback of every thread at a fatal signal (SIGSEGV,
# SIGABRT, ...) to a file its controller prints when the worker goes down; an empty file means
# the worker was killed (SIGKILL) or exited without a fault.
def _faults_file(controller: int, worker: str) -> Path:
    return Path(tempfile.gettempdir()) / f"fitjax-tests-{controller}-{worker}.faults"


@pytest.hookimpl(trylast=True)  # after pytest's own faulthandler plugin, which writes to stderr
def pytest_configure(config):
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        config._fitjax_faults = open(_faults_file(os.getppid(), worker), "a")  # noqa: SIM115 (open until exit)
        faulthandler.enable(file=config._fitjax_faults, all_threads=True)


def pytest_testnodedown(node, error):
    """xdist's controller: a worker went down; printed at once (a crashed worker can leave xdist's
    group scheduler waiting, pytest-xdist#1378: the run's own report may never come)."""
    if not error:
        return
    path = _faults_file(os.getpid(), node.gateway.id)
    text = path.read_text(errors="replace").strip() if path.exists() else ""
    print(f"\n{node.gateway.id} died: {text[-6000:] if text else 'no fatal signal (killed, or it exited)'}", flush=True)


def pytest_unconfigure(config):
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        for path in Path(tempfile.gettempdir()).glob(f"fitjax-tests-{os.getpid()}-*.faults"):
            path.unlink(missing_ok=True)
