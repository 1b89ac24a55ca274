"""One process of a launched run that waits for a signal: SIGTERM is handled (a file, status 0),
SIGINT is Python's KeyboardInterrupt. Writes OUT_DIR/ready_<rank> once its handler is set.
Plain Python: the launcher imports nothing (no JAX) before the script."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

out = Path(sys.argv[1])
rank = os.environ["JAX_PROCESS_ID"]
# the launcher imports nothing before the script: a script may still set JAX_* variables here
assert "jax" not in sys.modules and "fitjax" not in sys.modules, sorted(sys.modules)


def on_sigterm(signum, frame):
    (out / f"sigterm_{rank}").write_text(os.environ["JAX_NUM_PROCESSES"])
    sys.exit(0)


signal.signal(signal.SIGTERM, on_sigterm)
(out / f"pid_{rank}").write_text(str(os.getpid()))
(out / f"ready_{rank}").write_text("")
time.sleep(120)
