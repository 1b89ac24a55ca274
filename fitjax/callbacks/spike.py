"""`SpikeDetection`: Lightning's loss-spike rule, judged inside the jitted train step.

The rule and the state it keeps (a running mean of the last `window` accepted losses, the last
accepted one, the batch index for `warmup`) live in the train state (`fitjax.step.pieces.SpikeGuard`):
the host reads nothing per step. The host reads the piece's record at log steps and when an
epoch or training ends (a few scalars), so a spike is reported up to `log_every_n_steps` steps
after it happened; without `skip_update` the steps after it change nothing (the state stays the
one before the spike), so stopping then is stopping at the spike.
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import numpy as np

from fitjax.callbacks._base import Callback, ignores_batch, ignores_outputs
from fitjax.step.pieces import SpikeGuard

__all__ = ["SpikeDetection", "TrainingSpikeException"]

_MODES = ("min", "max")


class TrainingSpikeException(RuntimeError):
    """Raised by `SpikeDetection` when a loss spike was found (Lightning's exception and message)."""

    def __init__(self, batch_idx: int, *args: Any):
        self.batch_idx = batch_idx
        super().__init__(f"Training spike detected in batch {batch_idx}", *args)


class SpikeDetection(Callback):
    """Stops training at a loss spike, or skips the spiking steps, as Lightning's `SpikeDetection`.

    A step's loss is a spike when the batch index in the epoch is at least `warmup` and the loss
    is not finite (`finite_only`), or it is no better than the last accepted loss and is at
    least `atol` and `rtol` times the running mean away from the running mean of the last
    `window` accepted losses (Lightning's rule, numbers checked against it). By default the run
    then stops: the batch indices `[batch - 1, batch]` are written to `exclude_batches_path` (a
    JSON list, Lightning's `skip_batches.json`) and `TrainingSpikeException` names the batch.

    With `skip_update=True` (fitjax's own) a spike's update is dropped instead: the parameters,
    optimizer and model state stay those before the step, the run goes on, and the skips are
    counted (`skipped`, logged as `train/skipped_spikes`). No host sync per step either way:
    the rule runs inside the jitted step, and the host reads its record at log steps.

    With gradient accumulation the rule sees each optimizer step's loss (the mean over its
    micro-batches) once, at the index of its last batch (Lightning: every micro-batch's).

    Args:
        mode: "min" (a higher loss is worse) or "max".
        window: losses in the running mean.
        warmup: the first batches of each epoch that are never spikes (they join the mean).
        atol: the least absolute distance from the running mean of a spike (None: any).
        rtol: the least distance relative to the running mean (None: any).
        exclude_batches_path: the JSON file (or a folder for `skip_batches.json`); default
            `<default_root_dir>/skip_batches.json`.
        finite_only: a non-finite loss is a spike (True, Lightning's default); False: it is
            judged by the rule (and never joins the mean).
        skip_update: drop spiking steps' updates and go on instead of stopping.
        name: the key of the rule's state in `trainer.state.extras`.

    Example:
        >>> import fitjax as fj
        >>> trainer = fj.Trainer(callbacks=[fj.SpikeDetection(window=20, warmup=10, skip_update=True)])
    """

    def __init__(self, mode: str = "min", window: int = 10, warmup: int = 1, atol: float | None = None,
                 rtol: float | None = 2.0, exclude_batches_path: str | os.PathLike | None = None,
                 finite_only: bool = True, *, skip_update: bool = False, name: str = "spike"):
        if mode not in _MODES:
            raise ValueError(f"SpikeDetection(mode=...) must be one of {list(_MODES)}, got {mode!r}.")
        for arg, value, least in (("window", window, 1), ("warmup", warmup, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"SpikeDetection({arg}=...) must be an int >= {least}, got {value!r}.")
        for arg, value in (("atol", atol), ("rtol", rtol)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise ValueError(f"SpikeDetection({arg}=...) must be a number or None, got {value!r}.")
        self.mode, self.window, self.warmup, self.atol, self.rtol = mode, window, warmup, atol, rtol
        self.exclude_batches_path = exclude_batches_path
        self.finite_only, self.skip_update, self.name = bool(finite_only), bool(skip_update), name
        self.bad_batches: list[int] = []
        self.skipped = 0
        self._batches_per_step = 1

    def step_pieces(self) -> tuple[SpikeGuard]:
        return (SpikeGuard(self.name, mode=self.mode, window=self.window, warmup=self.warmup,
                           atol=None if self.atol is None else float(self.atol),
                           rtol=None if self.rtol is None else float(self.rtol), finite_only=self.finite_only,
                           skip_update=self.skip_update, batches_per_step=self._batches_per_step),)

    def setup(self, trainer, module, stage: str) -> None:
        k = trainer.step_options.accumulate_grad_batches
        for piece in trainer.step_options.pieces:  # the piece counts batches: k a step
            if isinstance(piece, SpikeGuard) and piece.name == self.name:
                piece.batches_per_step = k

    @ignores_outputs
    @ignores_batch
    def on_train_batch_end(self, trainer, module, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.progress.crossed(trainer.log_every_n_steps):
            self._read(trainer, module, log=True)

    def on_train_epoch_end(self, trainer, module) -> None:
        self._read(trainer, module)

    def _read(self, trainer, module, *, log: bool = False) -> None:
        # sync point: a few scalars, at log steps and epoch ends only
        record = jax.device_get(trainer.state.extras[self.name])
        self.skipped = int(record["skipped"])
        if log and self.skip_update:
            module.log("train/skipped_spikes", float(self.skipped))
        batch = int(np.asarray(record["spike"])[0])
        if batch >= 0 and not self.skip_update:
            self._stop(trainer, batch)

    def _stop(self, trainer, batch_idx: int) -> None:
        # Lightning's: the batch and the one before (which may have corrupted the weights)
        self.bad_batches.extend([batch_idx - 1, batch_idx])
        path = self.exclude_batches_path
        if path is None:
            path = os.path.join(trainer.default_root_dir, "skip_batches.json")
        elif not str(path).endswith(".json"):
            path = os.path.join(path, "skip_batches.json")
        if trainer.is_global_zero:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            with open(path, "w") as f:
                json.dump(self.bad_batches, f, indent=4)
        raise TrainingSpikeException(batch_idx=batch_idx)

    def state_dict(self) -> dict[str, Any]:
        return {"bad_batches": list(self.bad_batches), "skipped": self.skipped}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.bad_batches = list(state.get("bad_batches", []))
        self.skipped = int(state.get("skipped", 0))

    @property
    def state_key(self) -> str:
        return f"SpikeDetection[{self.name}]"
