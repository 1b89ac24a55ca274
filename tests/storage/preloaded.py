"""Child processes forked from one that imported a module once: for tests that start many short
real processes of fitjax (importing fitjax costs each ~2.5 s of CPU; a fork costs milliseconds).

    with Preloaded("fitjax._storage", env) as forks:
        child = forks.start("from fitjax import _storage; _storage.remove(...)")
        os.kill(child.pid, signal.SIGKILL)           # a real process, killed for real
        out = child.communicate(timeout=120)[0]      # as subprocess.Popen's; then child.returncode

The parent (`python -c _PARENT`) imports the module and nothing else (no JAX backend, no thread),
then for each line of code it reads forks a child that runs it, its output in a file, and writes
the child's pid and then its exit status (negative: the signal that ended it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading

_PARENT = r"""
import importlib, json, os, sys, traceback
importlib.import_module(sys.argv[1])
for line in sys.stdin:
    code, out = json.loads(line)
    pid = os.fork()
    if pid == 0:
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        rc = 0
        try:
            exec(code, {"__name__": "__main__"})
        except BaseException:
            traceback.print_exc()
            rc = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    print(pid, flush=True)
    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
"""


class Child:
    """One forked child: `pid`, `communicate(timeout)` -> (its output, None), then `returncode`."""

    def __init__(self, parent: subprocess.Popen, out: str) -> None:
        self._parent, self._out = parent, out
        self.pid = int(parent.stdout.readline())
        self.returncode: int | None = None

    def communicate(self, timeout: float) -> tuple[str, None]:
        status: list[str] = []
        reader = threading.Thread(target=lambda: status.append(self._parent.stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout)
        if not status:
            os.kill(self.pid, 9)
            raise subprocess.TimeoutExpired(f"forked child {self.pid}", timeout)
        self.returncode = int(status[0])
        with open(self._out) as file:
            return file.read(), None


class Preloaded:
    """A parent process that imported `module` (with `env`), forking a child per `start(code)`."""

    def __init__(self, module: str, env: dict[str, str]) -> None:
        self._folder = tempfile.TemporaryDirectory()
        self._count = 0
        self._parent = subprocess.Popen([sys.executable, "-c", _PARENT, module], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True, env=env)

    def start(self, code: str) -> Child:
        self._count += 1
        out = os.path.join(self._folder.name, f"child_{self._count}.txt")
        self._parent.stdin.write(json.dumps([code, out]) + "\n")
        self._parent.stdin.flush()
        return Child(self._parent, out)

    def __enter__(self) -> Preloaded:
        return self

    def __exit__(self, *exc) -> None:
        self._parent.stdin.close()
        try:
            self._parent.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._parent.kill()
            self._parent.wait()
        self._parent.stdout.close()
        self._folder.cleanup()
