"""One process of a launched run in which rank 1 raises while rank 0 waits for it in a collective.

Run by tests/cli/test_launch.py as `fitjax launch --nproc 2 launch_fail.py OUT_DIR`; each rank
writes its pid, rank 1 the time it raised.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import jax
from jax.experimental import multihost_utils

import fitjax as fj

out = Path(sys.argv[1])
(out / f"pid_{os.environ['JAX_PROCESS_ID']}").write_text(str(os.getpid()))
fj.strategies.initialize_distributed()  # the coordinator, count and id from the launcher
print(f"process {jax.process_index()} of {jax.process_count()}", flush=True)
if jax.process_index() == 1:
    (out / "raised_at").write_text(repr(time.time()))
    raise RuntimeError("rank 1 fails on purpose")
multihost_utils.sync_global_devices("waits for rank 1, which never comes")
