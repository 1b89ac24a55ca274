"""`StochasticWeightAveraging`: Lightning's SWA callback, the average kept in the train state."""

from __future__ import annotations

from typing import Callable

from fitjax.callbacks._base import Callback
from fitjax.step import learning_rate as lr_lib
from fitjax.step.pieces import StochasticAverage

__all__ = ["StochasticWeightAveraging"]

_STRATEGIES = ("cos", "linear")


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


class StochasticWeightAveraging(Callback):
    """Averages the parameters once per epoch from `swa_epoch_start` on and anneals the learning
    rate to `swa_lrs`; training ends with the average (Lightning's `StochasticWeightAveraging`).

    With Lightning's meaning and numbers (checked against a Lightning run in
    tests/callbacks/test_swa.py): the epochs counted from 1, SWA starts at epoch `s =
    swa_epoch_start` (an int, or `int(swa_epoch_start * max_epochs)` for a float), i.e. 0-based
    epoch `max(s - 1, 0)`. At the start of each epoch from there to the last, the parameters join
    an equal-weight average (so the last epoch's own updates are not in it, as in Lightning);
    the learning rate, from the value the optimizer had when SWA started, anneals to `swa_lrs`
    over `annealing_epochs` epochs (torch's `SWALR`, stepped per epoch) and then stays there.
    When the last epoch is done the average replaces the parameters: `module.variables`,
    `trainer.state.params` and validate/test/predict after fit use it. A model with running
    statistics (BatchNorm, Linen or NNX) then gets them recomputed with one pass over the train
    data: the average over batches of each batch's statistics (torch's `update_bn`).

    The average, its count and the learning-rate schedule are one entry of the train state
    (`trainer.state.extras[name]`): updated by one jitted function per epoch start (compiled
    once), sharded like the parameters (fsdp included), checkpointed, and resumed exactly.

    The learning rate is driven through `optax.inject_hyperparams`: `configure_optimizer`
    returns e.g. `optax.inject_hyperparams(optax.adam)(learning_rate=1e-3)` (a schedule as the
    learning rate, or Lightning's `lr_scheduler`, is overridden from the start epoch, as
    Lightning swaps the scheduler out); or through the module's `lr_schedule` (a number or a
    schedule `count -> lr`) that `configure_optimizer` builds the optimizer from, e.g.
    `optax.adam(self.lr_schedule)`: the update is rescaled by `swa rate / lr_schedule(count)`
    (checked when fit starts: the optimizer built with `lr_schedule` at 1 and at 2 must double its
    first update). Either way the rescaling is exact for updates proportional to the rate, and a
    schedule at 0 gives a zero update there whatever the rate. Validation during fit uses the
    current parameters.

    Args:
        swa_lrs: the SWA learning rate, a positive float (or a one-element list: one optimizer).
        swa_epoch_start: an int >= 1 (1-based epoch) or a float in [0, 1] (fraction of max_epochs).
        annealing_epochs: epochs of the annealing (0: `swa_lrs` at once).
        annealing_strategy: "cos" (`(1 - cos(pi t)) / 2`) or "linear".
        avg_fn: `avg_fn(averaged, param, num_averaged) -> new averaged` (jax, traced); default the
            equal-weight running mean.
        name: the key in `trainer.state.extras`.

    Example:
        >>> import fitjax as fj
        >>> trainer = fj.Trainer(max_epochs=20, callbacks=[fj.StochasticWeightAveraging(swa_lrs=1e-2)])
    """

    def __init__(self, swa_lrs: float | list[float], swa_epoch_start: int | float = 0.8,
                 annealing_epochs: int = 10, annealing_strategy: str = "cos",
                 avg_fn: Callable | None = None, *, name: str = "swa"):
        if isinstance(swa_epoch_start, bool) or not _is_number(swa_epoch_start) or (
                isinstance(swa_epoch_start, int) and swa_epoch_start < 1) or (
                isinstance(swa_epoch_start, float) and not 0.0 <= swa_epoch_start <= 1.0):
            raise ValueError(
                f"StochasticWeightAveraging(swa_epoch_start=...) must be an int >= 1 (the epoch, counted "
                f"from 1) or a float in [0, 1] (a fraction of max_epochs), got {swa_epoch_start!r}.")
        lrs = swa_lrs if isinstance(swa_lrs, (list, tuple)) else [swa_lrs]
        if not lrs or not all(_is_number(lr) and lr > 0 for lr in lrs):
            raise ValueError(f"StochasticWeightAveraging(swa_lrs=...) must be a positive float (or a list "
                             f"of them), got {swa_lrs!r}.")
        if len(lrs) != 1:
            raise ValueError(
                f"StochasticWeightAveraging(swa_lrs=...) got {len(lrs)} learning rates {swa_lrs!r}; fitjax's "
                "SWA drives one optimizer's learning rate (as Lightning's, which supports one optimizer): "
                "pass one float.")
        if isinstance(annealing_epochs, bool) or not isinstance(annealing_epochs, int) or annealing_epochs < 0:
            raise ValueError(f"StochasticWeightAveraging(annealing_epochs=...) must be an int >= 0, got "
                             f"{annealing_epochs!r}.")
        if annealing_strategy not in _STRATEGIES:
            raise ValueError(f"StochasticWeightAveraging(annealing_strategy=...) got {annealing_strategy!r}; "
                             f"use one of {list(_STRATEGIES)}.")
        if avg_fn is not None and not callable(avg_fn):
            raise ValueError(f"StochasticWeightAveraging(avg_fn=...) must be callable "
                             f"`(averaged, param, num_averaged) -> averaged`, got {avg_fn!r}.")
        if not isinstance(name, str) or not name:
            raise ValueError(f"StochasticWeightAveraging(name=...) must be a non-empty str, got {name!r}.")
        self.swa_lrs, self.swa_epoch_start = float(lrs[0]), swa_epoch_start
        self.annealing_epochs, self.annealing_strategy, self.name = annealing_epochs, annealing_strategy, name
        self._piece = StochasticAverage(name, swa_lr=self.swa_lrs, annealing_epochs=annealing_epochs,
                                        annealing_strategy=annealing_strategy, avg_fn=avg_fn)

    def step_pieces(self) -> tuple[StochasticAverage]:
        return (self._piece,)

    @property
    def swa_start(self) -> int | None:
        """The first SWA epoch, 0-based (known once fit starts)."""
        return self._piece.swa_start

    @property
    def swa_end(self) -> int | None:
        """The last SWA epoch, 0-based: `max_epochs - 1` (known once fit starts)."""
        return self._piece.swa_end

    def on_fit_start(self, trainer, module) -> None:
        max_epochs = trainer.max_epochs
        if max_epochs is None:
            raise ValueError("StochasticWeightAveraging needs Trainer(max_epochs=...): its start epoch and "
                             "its last epoch count from it (max_epochs=-1 or only max_steps was given).")
        found = lr_lib.count(trainer.state.opt_state)
        self._piece.schedule = None
        if found == 0 and lr_lib.schedule_of(module) is not None:
            lr_lib.check_follows_schedule(module, trainer.state.params, "StochasticWeightAveraging")
            self._piece.schedule = lr_lib.schedule_of(module)
        elif found != 1:
            raise lr_lib.missing_error("StochasticWeightAveraging", found, module=module, or_schedule=found == 0,
                                       note=" (or a schedule as learning_rate)")
        start = self.swa_epoch_start
        if isinstance(start, float):
            start = int(max_epochs * start)
        self._piece.swa_start = max(start - 1, 0)  # Lightning's 0-based `swa_start`
        self._piece.swa_end = max_epochs - 1

    @property
    def state_key(self) -> str:
        return f"StochasticWeightAveraging[{self.name}]"
