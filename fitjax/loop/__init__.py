"""The loop: `Trainer`, the progress object it owns (`Progress`, read by callbacks through
`ProgressView`) and the `Stage` hooks read (`trainer.stage`)."""

from fitjax.loop.progress import Position, Progress, ProgressView
from fitjax.loop.stage import Stage
from fitjax.loop.trainer import Trainer

__all__ = ["Position", "Progress", "ProgressView", "Stage", "Trainer"]
