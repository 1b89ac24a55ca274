"""What a user sees of a fit in an 80x24 terminal (tmux): every line fits, no number is cut."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

_FIT = """
import logging, sys
logging.basicConfig(level=logging.WARNING)
sys.path.insert(0, {tests!r})
from helpers import Regressor, regression_data
import fitjax as fj
val = fj.DataLoader(regression_data(n=64, seed=1), batch_size=32)
trainer = fj.Trainer(max_epochs=2, logger=False, enable_checkpointing=False, log_every_n_steps=2,
                     default_root_dir={root!r})
trainer.fit(Regressor(), fj.DataLoader(regression_data(), batch_size=32), val)
print("FIT-DONE")
"""


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_a_fit_in_an_80x24_tmux_terminal_fits_and_cuts_no_number(tmp_path):
    script = tmp_path / "fit.py"
    script.write_text(_FIT.format(tests=str(Path(__file__).resolve().parents[1]), root=str(tmp_path)))
    session = f"fitjax80-{os.getpid()}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                                       os.environ.get("PYTHONPATH", "")])}
    env.pop("COLUMNS", None)
    env.pop("LINES", None)
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "80", "-y", "24",
                    f"{sys.executable} {script} 2>/dev/null; sleep 60"], check=True, env=env)
    try:
        deadline, screen = time.monotonic() + 240, ""
        while time.monotonic() < deadline and "FIT-DONE" not in screen:
            time.sleep(1)
            screen = subprocess.run(["tmux", "capture-pane", "-p", "-J", "-t", session, "-S", "-200"],
                                    capture_output=True, text=True).stdout
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
    assert "FIT-DONE" in screen, screen
    # -J joins the lines the terminal wrapped: a line longer than 80 columns shows as one
    lines = [line.rstrip() for line in screen.splitlines()]
    assert max(len(line) for line in lines) <= 80, "\n".join(line for line in lines if len(line) > 80)
    assert not re.search(r"\d…|…\d", screen), screen  # no number cut by an ellipsis
    text = "\n".join(lines)
    assert re.search(r"^\d+ +Trainable params \(\S+ \S+\)$", text, re.M)  # the summary's totals, whole
    assert re.search(r"^0 │ Dense_0 +│ +288 │", text, re.M)  # a row per layer, with its count
    assert re.search(r"^Epoch 1/1 .* 8/8 \d:\d\d:\d\d \d:\d\d:\d\d \d+\.\d it/s$", text, re.M)  # the bar, whole
    assert len(re.findall(r"^Epoch \d done in ", text, re.M)) == 2
