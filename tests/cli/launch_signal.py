"""One process of a launched run that waits for SIGINT (Python's KeyboardInterrupt) and writes
OUT_DIR/ready_<rank> when it waits. Plain Python: the launcher imports nothing (no JAX) before it."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

out = Path(sys.argv[1])
rank = os.environ["JAX_PROCESS_ID"]
# the launcher imports nothing before the script: a script may still set JAX_* variables here
assert "jax" not in sys.modules and "fitjax" not in sys.modules, sorted(sys.modules)

(out / f"pid_{rank}").write_text(str(os.getpid()))
(out / f"ready_{rank}").write_text("")
time.sleep(120)
