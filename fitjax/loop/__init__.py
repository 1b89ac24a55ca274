"""The loop: `Trainer`, the progress object it owns (`Progress`, read by callbacks through
`ProgressView`) and the `Stage` hooks read (`trainer.stage`)."""

from fitjax.loop.progress import Position, Progress, ProgressView
from fitjax.loop.stage import Stage
from fitjax.loop.trainer import Trainer

# For the CLI and `fitjax launch`, not part of the user-facing API: `--ckpt_path` resolved as
# `fit(ckpt_path=)` does, and the variable a restarted process finds its restart count in.
from fitjax.loop._interrupt import DEBUG_VAR, Interrupted, exit_quietly_on_ctrl_c
from fitjax.loop._preemption import RESTART_COUNT_VAR
from fitjax.loop._resume import resolve_ckpt_path

__all__ = ["Position", "Progress", "ProgressView", "Stage", "Trainer"]
