"""`ModuleSpec`: everything the step layer needs of the user's module, as one frozen value.

`LitModule.step_spec()` makes it once per build; from then on the step layer reads the spec and
never the module (it imports nothing of `fitjax.module`, which sits above it). The callables are
the module's own methods (or the Lightning-style adapter's stand-ins for them), traced under jit.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable, Mapping

from fitjax._typing import Batch, Metrics, PyTree
from fitjax.step.model_binding import ModelBinding

__all__ = ["ModuleSpec"]


@dataclasses.dataclass(frozen=True)
class ModuleSpec:
    """What a module gives the step layer (`LitModule.step_spec()`).

    Attributes:
        owner: the module's class name, for errors.
        binding: the Linen/NNX binding of the module's flax model.
        variables: `(params, model_state)` the model already holds (after a fit, a restore, or an
            NNX model's own), or None: a Linen model is initialised by tracing.
        loss: `loss(model, batch) -> loss | (loss, outputs)`.
        metrics: `metrics(batch, outputs) -> {name: scalar}`.
        predict: `predict(model, batch) -> outputs`, what `Trainer.predict` traces.
        optimizer: `configure_optimizer()`, called when a fit is built (an eval needs none).
        lr_schedule: `() -> schedule | None`, the module's `lr_schedule` as a schedule, read when
            the train step is traced (`configure_optimizer` may set it).
        manual: each top-level parameter group is updated by the gradient of its own loss
            (Lightning's `automatic_optimization = False`).
        eval_stages: the evaluations with a step of their own, `("val",)` or `("val", "test")`
            (a Lightning-style `test_step` may log other names than `validation_step`).
        mode: `mode(training)`, a context in which the module's `training` flag is `training`.
        defined_at: `{"loss": ..., "metrics": ...}`, where the user's method is, for errors about
            what it returned (" (X.loss is defined at file:line)", or "").
        weights: weights from outside to start from (`LitModule.load_weights`), or None:
            `weights(abstract, shardings, initial) -> (params, model_state)` takes the abstract
            `(params, model_state)` and their shardings and returns the arrays placed in them;
            `initial()` gives the model's own (sharded) values for what the source lacks.
        axis_rules: the model's logical axis names -> mesh axes (`LitModule.logical_axis_rules`),
            which a strategy laying out logical names uses for what its own rules leave out.
    """

    owner: str
    binding: ModelBinding
    variables: tuple[PyTree, PyTree] | None
    loss: Callable[[Any, Batch], Any]
    metrics: Callable[[Batch, Any], Metrics]
    predict: Callable[[Any, Batch], Any]
    optimizer: Callable[[], Any]
    lr_schedule: Callable[[], Callable[[Any], Any] | None]
    manual: bool
    eval_stages: tuple[str, ...]
    mode: Callable[[bool], contextlib.AbstractContextManager[None]]
    defined_at: Mapping[str, str]
    weights: Callable[[tuple[PyTree, PyTree], tuple[PyTree, PyTree], Callable[[], tuple[PyTree, PyTree]]],
                      tuple[PyTree, PyTree]] | None = None
    axis_rules: Mapping[str, Any] | None = None
