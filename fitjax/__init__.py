"""fitjax: the PyTorch-Lightning experience on JAX.

Declare what to train in a `LitModule` (`loss`, `configure_optimizer`, `metrics`); `Trainer.fit`
builds the state, jits one step, shards it over devices, feeds data, logs and calls back.
"""

from fitjax import _bootstrap

# Before JAX is imported: Ctrl-C's handler, XLA:CPU's scheduler, no libtpu without a TPU; all of
# it documented in `fitjax._bootstrap`, none of it with FITJAX_BOOTSTRAP=0.
_bootstrap.start()

from fitjax import (callbacks, checkpoint, cli, data, loggers, metrics, models, nn, optim, planner, plugins,
                    precision, profilers, strategies, tuner)
from fitjax.callbacks import (
    EMA,
    BackboneFinetuning,
    BaseFinetuning,
    BasePredictionWriter,
    Callback,
    DeviceStatsMonitor,
    EarlyStopping,
    GenerationMonitor,
    GradientAccumulationScheduler,
    LambdaCallback,
    LearningRateMonitor,
    ModelCheckpoint,
    RichModelSummary,
    RichProgressBar,
    SpikeDetection,
    StochasticWeightAveraging,
    ThroughputMonitor,
    Timer,
    TQDMProgressBar,
)
from fitjax.data import DataLoader, DataModule
from fitjax.loggers import CSVLogger, Logger, TensorBoardLogger
from fitjax.module import LitModule, param_groups
from fitjax.precision import Precision
from fitjax.state import TrainState
from fitjax.loop import Trainer
from fitjax._generation_options import GenerationOptions
from fitjax.loop.plan import plan
from fitjax.planner import TransformerShape
from fitjax.step import TokenLoss
from fitjax.tuner import Tuner
from fitjax._seed import seed_everything

__version__ = "0.1.0"

__all__ = [
    "BackboneFinetuning",
    "BaseFinetuning",
    "BasePredictionWriter",
    "CSVLogger",
    "Callback",
    "DataLoader",
    "DataModule",
    "DeviceStatsMonitor",
    "EMA",
    "EarlyStopping",
    "GenerationMonitor",
    "GenerationOptions",
    "GradientAccumulationScheduler",
    "LambdaCallback",
    "LearningRateMonitor",
    "LightningCLI",
    "LitModule",
    "Logger",
    "ModelCheckpoint",
    "Precision",
    "RichModelSummary",
    "RichProgressBar",
    "SpikeDetection",
    "StochasticWeightAveraging",
    "TQDMProgressBar",
    "TensorBoardLogger",
    "ThroughputMonitor",
    "Timer",
    "TokenLoss",
    "TrainState",
    "Trainer",
    "TransformerShape",
    "Tuner",
    "callbacks",
    "checkpoint",
    "cli",
    "data",
    "loggers",
    "metrics",
    "models",
    "nn",
    "optim",
    "param_groups",
    "plan",
    "planner",
    "plugins",
    "precision",
    "profilers",
    "seed_everything",
    "strategies",
    "tuner",
]


_bootstrap.imported()  # a Ctrl-C held during the imports above is raised now


def __getattr__(name: str):
    # `fj.LightningCLI` imports jsonargparse on first use only: `import fitjax` stays without it.
    if name == "LightningCLI":
        return cli.LightningCLI
    raise AttributeError(f"module 'fitjax' has no attribute {name!r}")
