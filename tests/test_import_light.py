"""`import fitjax` stays light: heavy optional packages are imported where they are used, not before.

Run in a fresh interpreter: the test process itself has imported everything long before.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Each costs from ~0.3 s (orbax) to ~3 s (torch) at import on 2 CPU cores.
HEAVY = ["grain", "mlflow", "orbax", "sklearn", "tensorboard", "tensorboardX", "tensorstore", "torch", "wandb"]

_SCRIPT = """
import json, sys, tempfile
import fitjax as fj
after_import = sorted({m.split(".")[0] for m in sys.modules})
logger = fj.TensorBoardLogger(tempfile.mkdtemp())
logger.log_metrics({"train/loss": 1.0}, step=1)
logger.finalize("success")
after_tensorboard = sorted({m.split(".")[0] for m in sys.modules})
import torch  # still importable: tensorboardX was imported without it, not in its place
print(json.dumps({"after_import": after_import, "after_tensorboard": after_tensorboard,
                  "torch": torch.__version__}))
"""


def test_import_fitjax_imports_no_heavy_optional_package(tmp_path):
    out = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=ROOT, capture_output=True, text=True,
                         check=True, env={"PATH": "", "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"})
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert [m for m in HEAVY if m in found["after_import"]] == []
    # The TensorBoard logger imports tensorboardX at its first write, and torch not even then.
    assert "tensorboardX" in found["after_tensorboard"]
    assert "torch" not in found["after_tensorboard"]
    assert found["torch"]
