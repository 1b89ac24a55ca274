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


_SOON = """
import json, sys, tempfile, threading, time
import numpy as np
import fitjax as fj
from helpers import DenseRegression  # imports no Orbax: the fit below must

seen = {}
class Watch(fj.Callback):
    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        # the train step has compiled: the import started before it has had that long to run
        if batch_idx == 0:
            for thread in threading.enumerate():
                if thread.name == "import orbax.checkpoint":
                    thread.join(60)
            seen["orbax_before_first_save"] = "orbax.checkpoint" in sys.modules

assert "orbax.checkpoint" not in sys.modules
x = np.random.default_rng(0).normal(size=(64, 3)).astype(np.float32)
trainer = fj.Trainer(max_epochs=1, default_root_dir=tempfile.mkdtemp(), enable_progress_bar=False,
                     callbacks=[Watch()])
trainer.fit(DenseRegression(), fj.DataLoader({"x": x, "y": x[:, :1]}, batch_size=16))
missing = fj._lazy.LazyModule("fitjax_no_such_module")
missing.import_soon()
time.sleep(0.5)
try:
    missing.anything
    raised = None
except ImportError as err:
    raised = type(err).__name__
print(json.dumps({**seen, "saved": trainer.checkpoint_callback.last_model_path != "", "missing_raised": raised}))
"""


def test_orbax_is_imported_while_the_train_step_compiles_and_a_failed_import_raises_at_first_use():
    """A fit that saves imports Orbax on a thread from `on_train_start`, so the first save does
    not wait for it; a module that cannot be imported is silent there and raises where it is read."""
    out = subprocess.run([sys.executable, "-c", _SOON], cwd=ROOT, capture_output=True, text=True,
                         env={"PATH": "", "PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}", "JAX_PLATFORMS": "cpu"})
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found == {"orbax_before_first_save": True, "saved": True, "missing_raised": "ModuleNotFoundError"}
