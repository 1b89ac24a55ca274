"""Callbacks: objects with hook methods the trainer calls around steps, epochs and stages."""

from fitjax.callbacks._base import Callback, CallbackList
from fitjax.callbacks.model_checkpoint import ModelCheckpoint
from fitjax.callbacks.progress import RichProgressBar

__all__ = ["Callback", "CallbackList", "ModelCheckpoint", "RichProgressBar"]
