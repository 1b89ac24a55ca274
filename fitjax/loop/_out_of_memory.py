"""A fit whose step runs out of device memory ends with the planner's explanation: what the step
needs, what the device has (XLA's own figures) and the cheapest change that fits
(`fitjax.planner.out_of_memory_error`), XLA's error chained as its cause."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from fitjax import _status, planner

__all__ = ["explained"]


@contextlib.contextmanager
def explained(trainer: Any, run: Any) -> Iterator[None]:
    """Inside, XLA's out-of-memory error (compiling or running the fit's programs) is raised as a
    `fitjax.planner.OutOfMemoryError` from it. Not with `Trainer(runs=N)`: the planner plans one
    run's step."""
    try:
        yield
    except Exception as error:
        if not planner.is_out_of_memory(error) or run.batch_spec is None or trainer.runs is not None:
            raise
        target = planner.resolve_target("local", trainer.devices)  # the device's memory, else XLA's figure
        # one compilation per change tried (never run), paid only now that the step failed
        with _status.phase("planning what fits in memory", "planned what fits in memory"):
            explanation = planner.out_of_memory_error(run.module, run.batch_spec, target, strategy=trainer.strategy,
                                                      options=run.feed.options, headroom=0.1, xla_text=str(error))
        raise explanation from error
