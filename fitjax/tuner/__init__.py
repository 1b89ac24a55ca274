"""`Tuner`: Lightning's batch-size and learning-rate finders, on a trainer's step.

`scale_batch_size` asks the compiler, not the device: it lowers and compiles the train step for
each candidate batch size and reads XLA's memory analysis, so no candidate is run and nothing
runs out of memory. `lr_find` trains a copy of the state with a growing learning rate.
"""

from fitjax.tuner._batch_size import step_memory_bytes
from fitjax.tuner._lr_find import LRFinder
from fitjax.tuner._tuner import Tuner

__all__ = ["LRFinder", "Tuner", "step_memory_bytes"]
