"""`StepOptions`: the Trainer arguments that shape the train step, checked once at the boundary.

Each option is one more transform around the same gradient function (`fitjax.step.train`); none
of them selects another step body, so every option combines with every other, with manual
optimization and with every strategy.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

from fitjax import precision as precision_lib
from fitjax.step import pieces as pieces_lib
from fitjax.step.offload import check_offload
from fitjax.step.remat import check_remat
from fitjax.state import TrainState

__all__ = ["StepOptions"]

_CLIP_ALGORITHMS = ("norm", "value")


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    raise ValueError(f"Trainer({name}=...) must be a positive int, got {value!r}")


@dataclasses.dataclass(frozen=True)
class StepOptions:
    """The step-shaping Trainer arguments (see `Trainer` for their meaning)."""

    precision: precision_lib.Precision = precision_lib.Precision()
    accumulate_grad_batches: int = 1
    gradient_clip_val: float | None = None
    gradient_clip_algorithm: str = "norm"
    steps_per_execution: int = 1
    detect_anomaly: bool = False
    log_grad_norm: bool = False
    pieces: tuple[pieces_lib.StatePiece, ...] = ()  # from the callbacks' `step_pieces()`
    remat: str = "none"  # activation rematerialization per layer (`fitjax.step.remat`)
    offload: str = "none"  # train state fields kept in host memory between steps (`fitjax.step.offload`)
    update_in_backward: bool = False  # each layer updated inside the backward pass (`fitjax.step.in_backward`)
    # the step also returns what `training_step` / `loss` returned, for batch-end hooks that
    # read `outputs` (set by the trainer from its hooks, not a Trainer argument)
    hook_outputs: bool = False

    @classmethod
    def create(cls, *, precision="32-true", accumulate_grad_batches=1, gradient_clip_val=None,
               gradient_clip_algorithm="norm", steps_per_execution=1, detect_anomaly=False,
               log_grad_norm=False, remat="none", offload="none", update_in_backward=False) -> "StepOptions":
        """Checks the Trainer's arguments; the error names the argument and what it takes."""
        if gradient_clip_val is not None and (
            isinstance(gradient_clip_val, bool) or not isinstance(gradient_clip_val, (int, float))
            or not gradient_clip_val > 0
        ):
            raise ValueError(
                f"Trainer(gradient_clip_val=...) must be a positive number or None, got {gradient_clip_val!r}"
            )
        if gradient_clip_algorithm not in _CLIP_ALGORITHMS:
            raise ValueError(
                f"Trainer(gradient_clip_algorithm=...) got {gradient_clip_algorithm!r}; use one of "
                f"{list(_CLIP_ALGORITHMS)}."
            )
        options = cls(
            precision=precision_lib.resolve(precision),
            accumulate_grad_batches=_positive_int("accumulate_grad_batches", accumulate_grad_batches),
            gradient_clip_val=None if gradient_clip_val is None else float(gradient_clip_val),
            gradient_clip_algorithm=gradient_clip_algorithm,
            steps_per_execution=_positive_int("steps_per_execution", steps_per_execution),
            detect_anomaly=bool(detect_anomaly),
            log_grad_norm=bool(log_grad_norm),
            remat=check_remat(remat),
            offload=check_offload(offload),
            update_in_backward=update_in_backward,
        )
        if update_in_backward is not False:
            options._check_update_in_backward()
        return options

    def _check_update_in_backward(self) -> None:
        """Refuses what the layer-by-layer update cannot do: each needs the whole gradient at once."""
        if self.update_in_backward is not True:
            raise ValueError(f"Trainer(update_in_backward=...) must be True or False, got {self.update_in_backward!r}.")
        conflicts = {
            "accumulate_grad_batches": (self.accumulate_grad_batches > 1, self.accumulate_grad_batches,
                                        "the micro-batches' gradients would be summed before any update: "
                                        "use a larger batch with remat instead"),
            "gradient_clip_val": (self.gradient_clip_val is not None and self.gradient_clip_algorithm == "norm",
                                  self.gradient_clip_val, "a global-norm clip needs every gradient before the first "
                                  "update: clip by value (gradient_clip_algorithm='value') or not at all"),
            "precision": (self.precision.loss_scaling, self.precision.name,
                          "a loss-scaled step is skipped when any gradient is not finite, which is known only "
                          "after the last layer's update: use 'bf16-mixed' or 'bf16-true'"),
            "detect_anomaly": (self.detect_anomaly, self.detect_anomaly,
                               "its check of the whole gradient comes after the updates it should stop"),
            "remat": (self.remat not in ("none", "full"), self.remat,
                      "each layer is recomputed in its own backward step, as remat='full' does: use 'full' (or "
                      "'none', the same here)"),
            "offload": (self.offload != "none", self.offload, "the state is updated a layer at a time on the "
                        "device: keep offload='none'"),
        }
        for name, (bad, value, why) in conflicts.items():
            if bad:
                raise ValueError(f"Trainer(update_in_backward=True) cannot combine with {name}={value!r}: {why}.")

    @property
    def batches_per_call(self) -> int:
        """Batches one full call of the train step consumes."""
        return self.accumulate_grad_batches * self.steps_per_execution

    def train_metric_names(self, names: tuple[str, ...]) -> tuple[str, ...]:
        return (*names, "grad_norm") if self.log_grad_norm else names

    def wrap_optimizer(self, tx: optax.GradientTransformation, *, groups: bool = False
                       ) -> optax.GradientTransformation:
        """Clipping chained before the user's optimizer (it sees the accumulated, unscaled grads).

        With `groups` (manual optimization) each top-level parameter group is clipped on its own,
        as Lightning's `clip_gradients(optimizer, ...)` clips one optimizer's parameters.
        """
        if self.gradient_clip_val is None:
            return tx
        if self.gradient_clip_algorithm == "norm":
            clip = clip_by_global_norm(self.gradient_clip_val)
        else:
            clip = optax.clip(self.gradient_clip_val)
        return optax.chain(_per_group(clip) if groups else clip, tx)

    def wrap_init(self, init_fn: Callable[..., TrainState], tx: optax.GradientTransformation) -> Callable:
        """Parameters in their storage dtype (and the optimizer state built on them); the loss scale."""
        policy = self.precision
        if self.pieces:
            init_fn = self._with_pieces(init_fn)
        if policy.is_default:
            return init_fn

        def init(rng, batch, given):
            state = init_fn(rng, batch, given)
            params = policy.cast_params(state.params)
            opt_state = tx.init(params) if policy.param_dtype != jnp.float32 else state.opt_state
            return state.replace(params=params, opt_state=opt_state, loss_scale=policy.initial_loss_scale())

        return init

    def _with_pieces(self, init_fn: Callable[..., TrainState]) -> Callable[..., TrainState]:
        def init(rng, batch, given):
            state = init_fn(rng, batch, given)
            return state.replace(extras=pieces_lib.init_extras(self.pieces, state.params))

        return init


def global_norm(tree: Any) -> jax.Array:
    """The global L2 norm of a pytree (float32), as `optax.tree.norm` but with each leaf's sum of
    squares computed as a dot product.

    Measured on a loaded 2-core machine as cheaper than `optax.clip_by_global_norm`'s reduction
    on XLA:CPU; on a quiet one both roughly halve the tiny MLP's steps/s in a hand-written step,
    as does a norm computed as a matrix product: see README's speed section.
    Only the summation order differs from optax.
    """
    leaves = [x.ravel().astype(jnp.float32) for x in jax.tree.leaves(tree)]
    return jnp.sqrt(sum((jnp.vdot(x, x) for x in leaves), jnp.zeros((), jnp.float32)))


def clip_by_global_norm(max_norm: float) -> optax.GradientTransformation:
    """`optax.clip_by_global_norm(max_norm)` (the same state and formula) on `global_norm`."""

    def update(updates, state, params=None):
        del params
        norm = global_norm(updates)
        trigger = norm < max_norm
        return jax.tree.map(lambda t: jax.lax.select(trigger, t, (t / norm.astype(t.dtype)) * max_norm),
                            updates), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def _per_group(tx: optax.GradientTransformation) -> optax.GradientTransformation:
    """`tx` applied to each top-level key of the parameters separately."""

    def init(params):
        return {group: tx.init(p) for group, p in params.items()}

    def update(updates, state, params=None):
        new_updates, new_state = {}, {}
        for group, u in updates.items():
            new_updates[group], new_state[group] = tx.update(
                u, state[group], None if params is None else params[group])
        return new_updates, new_state

    return optax.GradientTransformation(init, update)


def host_values(state: TrainState) -> dict[str, jax.Array]:
    """Device values logged at every log time besides the metric accumulators."""
    ls = state.loss_scale
    if isinstance(ls, precision_lib.LossScale):
        return {"loss_scale": ls.scale, "skipped_steps": ls.skipped}
    return {}
