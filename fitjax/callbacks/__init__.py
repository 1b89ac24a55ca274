"""Callbacks: objects with hook methods the trainer calls around steps, epochs and stages."""

from fitjax.callbacks._base import Callback, CallbackList
from fitjax.callbacks.accumulation import GradientAccumulationScheduler
from fitjax.callbacks._defaults import DefaultCheckpoint, with_defaults
from fitjax.callbacks.device_stats import DeviceStatsMonitor
from fitjax.callbacks.early_stopping import EarlyStopping
from fitjax.callbacks.lambda_callback import LambdaCallback
from fitjax.callbacks.ema import EMA
from fitjax.callbacks.finetuning import BackboneFinetuning, BaseFinetuning
from fitjax.callbacks.generation_monitor import GenerationMonitor
from fitjax.callbacks.lr_monitor import LearningRateMonitor
from fitjax.callbacks.model_checkpoint import ModelCheckpoint
from fitjax.callbacks.prediction_writer import BasePredictionWriter
from fitjax.callbacks.progress import RichProgressBar
from fitjax.callbacks.spike import SpikeDetection, TrainingSpikeException
from fitjax.callbacks.summary import ModelSummary, RichModelSummary, summarize
from fitjax.callbacks.swa import StochasticWeightAveraging
from fitjax.callbacks.throughput import ThroughputMonitor
from fitjax.callbacks.timer import Timer
from fitjax.callbacks.tqdm_progress import TQDMProgressBar
from fitjax.callbacks.watchdog import Watchdog

__all__ = [
    "BackboneFinetuning",
    "BaseFinetuning",
    "BasePredictionWriter",
    "Callback",
    "CallbackList",
    "DefaultCheckpoint",
    "DeviceStatsMonitor",
    "EMA",
    "EarlyStopping",
    "GenerationMonitor",
    "GradientAccumulationScheduler",
    "LambdaCallback",
    "LearningRateMonitor",
    "ModelCheckpoint",
    "ModelSummary",
    "RichModelSummary",
    "RichProgressBar",
    "SpikeDetection",
    "StochasticWeightAveraging",
    "TQDMProgressBar",
    "ThroughputMonitor",
    "Timer",
    "TrainingSpikeException",
    "Watchdog",
    "summarize",
    "with_defaults",
]
