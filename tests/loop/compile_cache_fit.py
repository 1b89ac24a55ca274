"""A tiny fit in a process of its own, for tests/loop/test_compile_cache.py: prints JAX's cache
folder after `import fitjax` and after the fit, and what the persistent cache did (JAX's own log
lines: each program read back, each compiled). With HIDE_FILELOCK=1, as if `filelock` were not
installed."""

import json
import logging
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
if os.environ.get("HIDE_FILELOCK"):  # an environment assembled by hand, without fitjax's `filelock`
    sys.modules["filelock"] = None

import fitjax as fj  # noqa: E402
import jax  # noqa: E402
from helpers import Regressor, quiet_trainer, regression_data  # noqa: E402

after_import = jax.config.jax_compilation_cache_dir
said = {"hits": [], "misses": []}


class _Cache(logging.Handler):
    def emit(self, record):
        message = record.getMessage()
        if message.startswith("Persistent compilation cache hit for"):
            said["hits"].append(message.split("'")[1])
        elif message.startswith("PERSISTENT COMPILATION CACHE MISS for"):
            said["misses"].append(message.split("'")[1])


compiler_log = logging.getLogger("jax._src.compiler")
compiler_log.addHandler(_Cache(level=logging.DEBUG))
compiler_log.setLevel(logging.DEBUG)
trainer = quiet_trainer(max_steps=2, strategy="single")
trainer.fit(Regressor(), fj.DataLoader(regression_data(n=64), batch_size=16),
            fj.DataLoader(regression_data(n=32, seed=1), batch_size=16))
print(json.dumps({"after_import": after_import, "after_fit": jax.config.jax_compilation_cache_dir, **said}))
