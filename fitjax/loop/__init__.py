"""The loop: `Trainer` and the progress object it owns (`Progress`, read by callbacks through
`ProgressView`)."""

from fitjax.loop.progress import Position, Progress, ProgressView
from fitjax.loop.trainer import Trainer

__all__ = ["Position", "Progress", "ProgressView", "Trainer"]
