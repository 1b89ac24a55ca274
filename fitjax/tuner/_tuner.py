"""`Tuner(trainer)`: `scale_batch_size` and `lr_find` with Lightning's names and meaning."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import numpy as np

from fitjax import step as step_lib
from fitjax.data import as_loader, batch_size_of
from fitjax.step import learning_rate as lr_lib
from fitjax.tuner import _batch_size, _lr_find

__all__ = ["Tuner"]

_SEARCH_MODES = ("power", "binsearch")


class Tuner:
    """Finds a batch size and a learning rate for `trainer` (Lightning's `lightning.pytorch.tuner.Tuner`).

    Both leave the module and the trainer as they were: they build a state of their own with the
    trainer's strategy, precision and step options (`trainer.strategy`, `trainer.step_options`).

    Example:
        >>> import fitjax as fj
        >>> tuner = fj.Tuner(fj.Trainer(max_epochs=3))
        >>> # size = tuner.scale_batch_size(module, datamodule=dm, mode="binsearch")
        >>> # lr = tuner.lr_find(module, train_loader).suggestion()
    """

    def __init__(self, trainer):
        self.trainer = trainer
        #: batch size -> peak bytes per device of its compiled train step, from the last search
        self.batch_size_trials: dict[int, int] = {}

    # ------------------------------------------------------------------------ batch size

    def scale_batch_size(self, module, train_data: Any = None, *, datamodule=None, mode: str = "power",
                         max_memory_bytes: int | None = None, init_val: int = 2, max_trials: int = 25,
                         batch_arg_name: str = "batch_size") -> int:
        """The largest batch size whose compiled train step fits in memory, without running it.

        Each candidate's train step (with the trainer's strategy, precision, accumulation, ...)
        is lowered and compiled for abstract inputs, and XLA's `memory_analysis()` gives its peak
        bytes per device (`fitjax.tuner.step_memory_bytes`). "power" doubles from `init_val`
        while the step fits; "binsearch" then bisects between the last fit and the first miss.
        Candidates are multiples of the number of batch shards (devices the batch is split over).

        Args:
            module: the `LitModule` (left as it was).
            train_data: train batches (their shapes and dtypes are used, not their values).
            datamodule: or a `DataModule`; its `batch_arg_name` attribute is set to the result.
            mode: "power" or "binsearch".
            max_memory_bytes: the budget per device. Default: the device's memory limit; a device
                that reports none (CPU) needs it.
            init_val: the first candidate.
            max_trials: at most this many candidates are compiled.
            batch_arg_name: the datamodule (or module) attribute set to the result, when it has one.

        Returns:
            The batch size (also in `datamodule.<batch_arg_name>` when that attribute exists).
        """
        if mode not in _SEARCH_MODES:
            raise ValueError(f"scale_batch_size(mode=...) got {mode!r}; use one of {list(_SEARCH_MODES)}.")
        for name, value in (("init_val", init_val), ("max_trials", max_trials)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"scale_batch_size({name}=...) must be a positive int, got {value!r}.")
        budget = max_memory_bytes
        if budget is None:
            budget = _batch_size.device_memory_limit(self.trainer.devices[0])
            if budget is None:
                raise ValueError(
                    f"scale_batch_size: the device ({self.trainer.devices[0].platform}) reports no memory "
                    "limit, so there is nothing to fit under: pass max_memory_bytes=... (bytes per device, "
                    "e.g. max_memory_bytes=2 << 30).")
        elif isinstance(budget, bool) or not isinstance(budget, int) or budget <= 0:
            raise ValueError(f"scale_batch_size(max_memory_bytes=...) must be a positive int (bytes per "
                             f"device) or None, got {budget!r}.")
        batch = self._first_batch(train_data, datamodule, "scale_batch_size")
        probe = _batch_size.BatchSizeProbe(module, self.trainer.strategy, self.trainer.step_options, batch,
                                           seed=self.trainer.seed)
        size = _batch_size.search(lambda b: probe(b) <= budget, mode=mode, init_val=init_val,
                                  step=probe.shards, max_trials=max_trials)
        self.batch_size_trials = dict(probe.measured)
        for owner in (datamodule, module):  # Lightning sets it where it finds it
            if owner is not None and hasattr(owner, batch_arg_name):
                setattr(owner, batch_arg_name, size)
                break
        return size

    # --------------------------------------------------------------------- learning rate

    def lr_find(self, module, train_data: Any = None, *, datamodule=None, min_lr: float = 1e-8,
                max_lr: float = 1.0, num_training: int = 100, mode: str = "exponential",
                early_stop_threshold: float | None = 4.0) -> _lr_find.LRFinder:
        """Trains a copy of the state for `num_training` steps while the learning rate grows from
        `min_lr` to `max_lr` ("exponential" or "linear"), recording the smoothed loss.

        The learning rate enters one of two ways:
        - `optax.inject_hyperparams`: `configure_optimizer` returns e.g.
          `optax.inject_hyperparams(optax.adam)(learning_rate=1e-3)` (a number, not a schedule: a
          schedule would set it again each step); each step's rate is written into that state.
        - the module's `lr_schedule` (a number or a schedule `count -> lr`) that
          `configure_optimizer` builds the optimizer from, e.g. `optax.adam(self.lr_schedule)`:
          each update is rescaled by `lr / lr_schedule(count)` inside the step (exact for an
          update proportional to its rate, which is checked first: the optimizer is built with
          `lr_schedule` at 1 and at 2 and its first update must double). The rate is a value of
          the state, so the step compiles once for all rates.
        Stops early when the smoothed loss passes `early_stop_threshold` times its best, as
        Lightning does. The module keeps its weights and its `lr_schedule`, the trainer its state.

        Returns:
            An `LRFinder`: `.results`, `.suggestion()`, `.plot(suggest=True)`.
        """
        if mode not in _lr_find._MODES:
            raise ValueError(f"lr_find(mode=...) got {mode!r}; use 'exponential' or 'linear'.")
        if not (isinstance(min_lr, (int, float)) and isinstance(max_lr, (int, float)) and 0 < min_lr < max_lr):
            raise ValueError(f"lr_find needs 0 < min_lr < max_lr, got min_lr={min_lr!r}, max_lr={max_lr!r}.")
        if isinstance(num_training, bool) or not isinstance(num_training, int) or num_training < 2:
            raise ValueError(f"lr_find(num_training=...) must be an int >= 2, got {num_training!r}.")
        loader = self._loader(train_data, datamodule, "lr_find")
        first = next(iter(loader), None)
        if first is None:
            raise ValueError("lr_find: train_data is empty: it yielded no batch.")
        options = _batch_size.replace_spe(self.trainer.step_options, 1)  # one learning rate per call
        lrs = _lr_find.lr_values(float(min_lr), float(max_lr), num_training, mode)
        state, compiled, imposed = self._lr_find_step(module, first, options, num_training)
        size = batch_size_of(first)
        tried, losses, avg, best = [], [], 0.0, math.inf
        beta = 0.98
        epoch = 0
        while len(tried) < num_training:
            if hasattr(loader, "set_epoch"):
                loader.set_epoch(epoch)
            batches = (b for b in loader if batch_size_of(b) == size)  # one shape: one compilation
            stopped = False
            for chunk in step_lib.group_batches(batches, options, steps_left=num_training - len(tried)):
                lr = float(lrs[len(tried)])
                if imposed is None:  # inject_hyperparams: the rate is written into the optimizer state
                    state = state.replace(opt_state=lr_lib.set_host(state.opt_state, lr))
                else:  # lr_schedule: the step rescales its update to the rate held in the state
                    state = state.replace(extras=imposed.set_host(state.extras, lr))
                step_fn = compiled.train_step if chunk.full else compiled.train_tail_step
                state, values = step_fn(state, chunk.inputs)
                loss = float(values["loss"])  # sync point: every step (a short diagnostic run)
                if not tried and imposed is None:
                    self._check_lr_kept(module, state.opt_state, lr)
                avg = beta * avg + (1 - beta) * loss
                smoothed = avg / (1 - beta ** (len(tried) + 1))
                tried.append(lr)
                losses.append(smoothed)
                if early_stop_threshold is not None and len(tried) > 1 and smoothed > early_stop_threshold * best:
                    stopped = True
                    break
                best = min(best, smoothed)
            epoch += 1
            if stopped or (epoch > 1 and not tried):
                break
        del state  # the copy: nothing of it reaches the module or the trainer
        log_dir = self.trainer.log_dir or self.trainer.default_root_dir
        return _lr_find.LRFinder(mode, tried, losses, log_dir)

    def _lr_find_step(self, module, batch, options, num_training: int):
        """The state and compiled step lr_find trains, and the piece imposing its rate (None: the
        rate is written into the `inject_hyperparams` state instead)."""
        state, compiled = step_lib.build(module.step_spec(), self.trainer.strategy, batch, seed=self.trainer.seed,
                                         options=options)
        if lr_lib.count(state.opt_state):
            return state, compiled, None
        schedule = lr_lib.schedule_of(module)
        if schedule is None:
            raise lr_lib.missing_error("lr_find", 0, module=module, needs="at least one", or_schedule=True,
                                       learning_rate="self.hparams.lr", note=" (with a number as learning_rate)")
        # the optimizer counts its updates from 0: a zero rate there gives a zero update, which no
        # rescaling turns into the swept rate's
        zeros = [i for i in range(num_training) if float(np.asarray(schedule(i))) == 0.0]
        if zeros:
            raise ValueError(
                f"lr_find rescales each update of {type(module).__name__}'s optimizer by lr / lr_schedule(count), "
                f"but lr_schedule is 0 at count {zeros[0]} (e.g. a warmup from 0), where the update is 0 "
                "whatever the rate: for lr_find, start the schedule above 0 (or use a constant lr_schedule).")
        lr_lib.check_follows_schedule(module, state.params, "lr_find")
        del state  # built again with the piece holding the rate (the first one's step never compiled)
        piece = _lr_find.ImposedRate()
        options = dataclasses.replace(options, pieces=(*options.pieces, piece))
        state, compiled = step_lib.build(module.step_spec(), self.trainer.strategy, batch, seed=self.trainer.seed,
                                         options=options)
        return state, compiled, piece

    @staticmethod
    def _check_lr_kept(module, opt_state, lr: float) -> None:
        """A schedule (`inject_hyperparams(opt)(learning_rate=schedule)`, or configure_optimizers'
        'lr_scheduler') sets the learning rate again inside each update, overriding lr_find's."""
        used = lr_lib.host_values(opt_state)
        if not np.allclose(used, lr, rtol=1e-6):
            raise ValueError(
                f"lr_find set the learning rate to {lr:.3g}, but {type(module).__name__}'s optimizer "
                f"used {used[0]:.3g}: a schedule sets it inside each update. For lr_find, return "
                f"a constant learning rate, e.g. `{lr_lib.example('self.hparams.lr')}` with no "
                "'lr_scheduler', then add the schedule back with the suggested lr.")

    # --------------------------------------------------------------------------- data

    def _loader(self, train_data, datamodule, method: str):
        if datamodule is not None:
            if train_data is not None:
                raise ValueError(f"Tuner.{method}: pass either train_data or datamodule=, not both.")
            datamodule.prepare_data()
            datamodule.setup("fit")
            train_data = datamodule.train_dataloader()
        if train_data is None:
            raise ValueError(f"Tuner.{method} needs train_data (e.g. `fj.DataLoader(arrays, batch_size=64)`) "
                             "or datamodule=.")
        return as_loader(train_data, name="train_data")

    def _first_batch(self, train_data, datamodule, method: str):
        batch = next(iter(self._loader(train_data, datamodule, method)), None)
        if batch is None:
            raise ValueError(f"Tuner.{method}: train_data is empty: it yielded no batch.")
        return jax.tree.map(np.asarray, batch)
