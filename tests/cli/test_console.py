"""The `fitjax` console command (`python -m fitjax.cli`, what `[project.scripts]` installs) in a
fresh interpreter, and `import fitjax` without jsonargparse."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import tomllib
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKTREE = HERE.parents[1]

_IMPORTS = """
import json, sys
import fitjax as fj
before = "jsonargparse" in sys.modules
cli = fj.LightningCLI
print(json.dumps({"before": before, "after": "jsonargparse" in sys.modules, "name": cli.__name__}))
"""


def run(*args, cwd=WORKTREE) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(WORKTREE), str(HERE)])}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_import_fitjax_does_not_import_jsonargparse_until_lightning_cli_is_used():
    out = run("-c", _IMPORTS)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"before": False, "after": True, "name": "LightningCLI"}


def test_the_console_script_is_fitjax_cli_main():
    scripts = tomllib.loads((WORKTREE / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"fitjax": "fitjax.cli:main"}


def test_console_command_exits_2_on_a_bad_value_without_a_traceback(tmp_path):
    out = run("-m", "fitjax.cli", "fit", "--model.class_path=cli_parts.PlainRegressor",
              "--data.class_path=cli_parts.RegressorData", "--trainer.max_epochs=many", cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert "trainer.max_epochs" in out.stderr and "many" in out.stderr and "int" in out.stderr
    assert "Traceback" not in out.stderr and "usage:" not in out.stderr  # one line, not 40 of usage
    assert out.stderr.startswith("error: --trainer.max_epochs: got 'many', expected int\n")
    assert "tip: fitjax fit --help" in out.stderr


def test_digits_example_trains_through_the_console_command_with_its_config(tmp_path):
    out = run("-m", "fitjax.cli", "fit", "--config", "examples/configs/digits.yaml", "--trainer.max_epochs=1",
              "--trainer.limit_train_batches=4", "--trainer.limit_val_batches=1", f"--trainer.default_root_dir={tmp_path}",
              "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false")
    assert out.returncode == 0, out.stderr[-4000:]
    saved = (tmp_path / "fitjax_logs" / "version_0" / "config.yaml").read_text()
    assert "class_path: examples.digits.DigitsClassifier" in saved and "limit_train_batches: 4" in saved
    assert list((tmp_path / "fitjax_logs" / "version_0" / "checkpoints").glob("*step=4"))

    # TensorBoard served on 127.0.0.1: its HPARAMS tab shows (ticks) the first five
    # hyperparameters, those marked as differing sorted first, and the first five metrics
    experiment = _served_hparams_experiment(tmp_path / "fitjax_logs")
    hparams = sorted(experiment["hparamInfos"], key=lambda h: (not h.get("differs", False), h["name"]))
    assert "model/lr" in [h["name"] for h in hparams[:5]], hparams
    metrics = [m["name"]["tag"] for m in experiment["metricInfos"]]
    assert metrics[:2] == ["val/loss", "val/acc"] or metrics[:2] == ["val/acc", "val/loss"], metrics
    assert not [m for m in metrics if m.startswith("compile/") or m == "epoch"], metrics


def _served_hparams_experiment(logdir) -> dict:
    """What a TensorBoard server started on 127.0.0.1 serves to its HPARAMS tab."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--host", "127.0.0.1",
                               "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    request = urllib.request.Request(f"http://127.0.0.1:{port}/data/plugin/hparams/experiment",
                                     data=json.dumps({"experimentName": ""}).encode(),
                                     headers={"Content-Type": "application/json", "X-XSRF-Protected": "1"})
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                return json.loads(urllib.request.urlopen(request, timeout=10).read())
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise
                time.sleep(0.5)
    finally:
        server.kill()
        server.wait()
