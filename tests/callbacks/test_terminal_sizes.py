"""What a user sees of a fit in an 80x24 and a 200x50 terminal (tmux): every line fits, no number is cut."""

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


def _start(tmp_path: Path, columns: int, rows: int) -> str:
    """The fit in a tmux terminal of `columns` x `rows` of its own; returns the session's name."""
    script = tmp_path / f"fit_{columns}.py"
    script.write_text(_FIT.format(tests=str(Path(__file__).resolve().parents[1]), root=str(tmp_path / str(columns))))
    session = f"fitjax{columns}-{os.getpid()}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                                       os.environ.get("PYTHONPATH", "")])}
    env.pop("COLUMNS", None)
    env.pop("LINES", None)
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", str(columns), "-y", str(rows),
                    f"{sys.executable} {script} 2>/dev/null; sleep 60"], check=True, env=env)
    return session


def _screen(session: str, deadline: float) -> str:
    """The session's whole screen and scroll-back once the fit is done; the session ends."""
    screen = ""
    try:
        while time.monotonic() < deadline and "FIT-DONE" not in screen:
            time.sleep(1)
            screen = subprocess.run(["tmux", "capture-pane", "-p", "-J", "-t", session, "-S", "-200"],
                                    capture_output=True, text=True).stdout
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
    return screen


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_a_fit_in_80x24_and_200x50_tmux_terminals_fits_and_cuts_no_number(tmp_path):
    sizes = {80: 24, 200: 50}  # issue 35's two terminals, run at once
    sessions = {columns: _start(tmp_path, columns, rows) for columns, rows in sizes.items()}
    deadline = time.monotonic() + 240
    for columns, session in sessions.items():
        screen = _screen(session, deadline)
        assert "FIT-DONE" in screen, screen
        # -J joins the lines the terminal wrapped: a line longer than the terminal shows as one
        lines = [line.rstrip() for line in screen.splitlines()]
        assert max(len(line) for line in lines) <= columns, "\n".join(line for line in lines if len(line) > columns)
        assert not re.search(r"\d…|…\d", screen), screen  # no number cut by an ellipsis
        text = "\n".join(lines)
        assert re.search(r"^\d+ +Trainable params \(\S+ \S+\)$", text, re.M), text  # the summary's totals, whole
        assert re.search(r"^0 │ Dense_0 +│ +288 │", text, re.M), text  # a row per layer, with its count
        assert re.search(r"^Epoch 1/1 .* 8/8 \d:\d\d:\d\d \d:\d\d:\d\d \d+\.\d it/s$", text, re.M), text  # the bar
        assert len(re.findall(r"^Epoch \d done in ", text, re.M)) == 2, text
