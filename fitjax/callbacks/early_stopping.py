"""`EarlyStopping`: stop fitting when a monitored value stops improving (Lightning's semantics).

It reads `trainer.callback_metrics`, the host values the trainer already fetched. When it checks
is Lightning's rule: at the end of each train epoch when validation runs once per epoch at its
end (the default), else after each validation. No check during the sanity check or with
`fast_dev_run`. `trainer.min_epochs` / `min_steps` delay the stop it requests.
"""

from __future__ import annotations

import math
from typing import Any

from fitjax.callbacks._base import Callback

__all__ = ["EarlyStopping"]

_MODES = ("min", "max")


def _check_number(name: str, value: Any, *, optional: bool = False) -> None:
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        allowed = "None or a number" if optional else "a number"
        raise ValueError(f"EarlyStopping({name}=...) must be {allowed}, got {value!r}")


class EarlyStopping(Callback):
    """Stops training when `monitor` has not improved for `patience` checks.

    Args:
        monitor: the key to watch, as logged (`"val/loss"`, `"val/acc"`, `"train/loss_epoch"`).
        mode: "min" (lower is better) or "max".
        patience: how many checks without improvement to allow before stopping.
        min_delta: the smallest change that counts as an improvement.
        stopping_threshold: stop as soon as the value is at least this good.
        divergence_threshold: stop as soon as the value is worse than this.
        check_finite: stop when the value becomes NaN or infinite.
        check_on_train_epoch_end: check at train epoch ends instead of after validations
            (default, as Lightning: at epoch ends when `val_check_interval` and
            `check_val_every_n_epoch` are at their defaults, after each validation otherwise).
        verbose: print why training stopped.

    With `Trainer(runs=...)` and a `monitor` logged per run (`val/loss` as `val/loss/run_<i>`),
    each run is judged on its own: a run that stops keeps its parameters (its updates are
    masked out of the step, `trainer.stop_run(i)`) while the others go on, and fit ends when
    every run has stopped. `stopped_runs[i]` is the epoch run i stopped in (None: it did not).

    Example:
        >>> import fitjax as fj
        >>> stopper = fj.EarlyStopping("val/loss", patience=3, min_delta=1e-4)
        >>> trainer = fj.Trainer(max_epochs=100, callbacks=[stopper])
    """

    def __init__(
        self,
        monitor: str,
        *,
        mode: str = "min",
        patience: int = 3,
        min_delta: float = 0.0,
        stopping_threshold: float | None = None,
        divergence_threshold: float | None = None,
        check_finite: bool = True,
        check_on_train_epoch_end: bool | None = None,
        verbose: bool = False,
    ):
        if not isinstance(monitor, str) or not monitor:
            raise ValueError(f"EarlyStopping(monitor=...) must be a logged key such as 'val/loss', got {monitor!r}")
        if mode not in _MODES:
            raise ValueError(f"EarlyStopping(mode=...) must be one of {_MODES}, got {mode!r}")
        if not isinstance(patience, int) or isinstance(patience, bool) or patience < 0:
            raise ValueError(f"EarlyStopping(patience=...) must be an int >= 0, got {patience!r}")
        _check_number("min_delta", min_delta)
        _check_number("stopping_threshold", stopping_threshold, optional=True)
        _check_number("divergence_threshold", divergence_threshold, optional=True)
        self.monitor = monitor
        self.mode = mode
        self.patience = patience
        self.min_delta = abs(float(min_delta))
        self.stopping_threshold = stopping_threshold
        self.divergence_threshold = divergence_threshold
        self.check_finite = check_finite
        self._check_at_epoch_end_arg = check_on_train_epoch_end
        self.check_on_train_epoch_end = check_on_train_epoch_end  # None: decided in `setup`
        self.verbose = verbose
        self.wait_count = 0
        self.best_score = math.inf if mode == "min" else -math.inf
        self.stopped_epoch = 0  # the epoch of the stop; 0 when training did not stop (Lightning)
        self.stopping_reason: str | None = None
        self._fitting = False
        self._per_run: list[list] = []  # with runs: per run [best_score, wait_count, stopped epoch or None]

    @property
    def state_key(self) -> str:
        return f"EarlyStopping[monitor={self.monitor}]"

    def _better(self, value: float, than: float) -> bool:
        return value < than - self.min_delta if self.mode == "min" else value > than + self.min_delta

    # -------------------------------------------------------------------------------- hooks

    def setup(self, trainer, module, stage: str) -> None:
        self._fitting = stage == "fit"
        if self._check_at_epoch_end_arg is None:
            self.check_on_train_epoch_end = (trainer.val_check_interval in (None, 1.0)
                                             and trainer.check_val_every_n_epoch == 1)

    def teardown(self, trainer, module, stage: str) -> None:
        self._fitting = False

    def on_validation_end(self, trainer, module) -> None:
        if self._fitting and not self.check_on_train_epoch_end and not trainer.sanity_checking:
            self._check(trainer)

    def on_train_epoch_end(self, trainer, module) -> None:
        if self.check_on_train_epoch_end:
            self._check(trainer)

    def _check(self, trainer) -> None:
        if trainer.fast_dev_run:  # a smoke test of the code, not of the model (Lightning)
            return
        metrics = trainer.callback_metrics
        if self.monitor not in metrics and trainer.runs is not None and f"{self.monitor}/run_0" in metrics:
            self._check_runs(trainer, metrics)
            return
        if self.monitor not in metrics:
            raise RuntimeError(
                f"EarlyStopping(monitor={self.monitor!r}) found no such logged value. Logged keys: "
                f"{sorted(metrics)}. Pick one of them (validation keys appear once validation runs)."
            )
        value = float(metrics[self.monitor])
        reason = self._evaluate(value)
        if reason is not None:
            self.stopped_epoch = trainer.current_epoch
            self.stopping_reason = reason
            trainer.should_stop = True  # Lightning's contract: the loop ends after this step/epoch
            if self.verbose:
                print(f"EarlyStopping: {reason}", flush=True)

    def _check_runs(self, trainer, metrics) -> None:
        """Each run of a `Trainer(runs=...)` fit judged on its own value; the fit stops once all have."""
        if len(self._per_run) != trainer.runs.size:
            self._per_run = [[self.best_score, self.wait_count, None] for _ in range(trainer.runs.size)]
        for i, entry in enumerate(self._per_run):
            if entry[2] is not None:
                continue
            self.best_score, self.wait_count = entry[0], entry[1]
            reason = self._evaluate(float(metrics[f"{self.monitor}/run_{i}"]))
            entry[0], entry[1] = self.best_score, self.wait_count
            if reason is not None:
                entry[2] = trainer.current_epoch
                trainer.stop_run(i)
                if self.verbose:
                    print(f"EarlyStopping: run {i} ({trainer.runs.names[i]}): {reason}", flush=True)
        if all(entry[2] is not None for entry in self._per_run):
            self.stopped_epoch = trainer.current_epoch
            self.stopping_reason = "every run stopped."
            trainer.should_stop = True

    @property
    def stopped_runs(self) -> list[int | None]:
        """With `Trainer(runs=...)`: the epoch each run stopped in (None: still training)."""
        return [entry[2] for entry in self._per_run]

    def _evaluate(self, value: float) -> str | None:
        name = self.monitor
        if self.check_finite and not math.isfinite(value):
            return f"{name} = {value} is not finite."
        if self.stopping_threshold is not None and not self._reached(self.stopping_threshold, value):
            return f"{name} = {value:.6g} reached the stopping threshold {self.stopping_threshold}."
        if self.divergence_threshold is not None and self._reached(self.divergence_threshold, value):
            return f"{name} = {value:.6g} is worse than the divergence threshold {self.divergence_threshold}."
        if self._better(value, self.best_score):
            self.best_score = value
            self.wait_count = 0
            return None
        self.wait_count += 1
        if self.wait_count >= self.patience:
            return (f"{name} did not improve by more than {self.min_delta} in {self.wait_count} checks; "
                    f"best {self.best_score:.6g}.")
        return None

    def _reached(self, value: float, bound: float) -> bool:
        """`value` is strictly better than `bound` in this mode."""
        return value < bound if self.mode == "min" else value > bound

    # -------------------------------------------------------------------------- checkpoints

    def state_dict(self) -> dict[str, Any]:
        return {"wait_count": self.wait_count, "best_score": self.best_score, "patience": self.patience,
                "stopped_epoch": self.stopped_epoch, "runs": [list(entry) for entry in self._per_run]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.wait_count = int(state["wait_count"])
        self.best_score = float(state["best_score"])
        self.stopped_epoch = int(state.get("stopped_epoch") or 0)
        self._per_run = [list(entry) for entry in state.get("runs") or []]
