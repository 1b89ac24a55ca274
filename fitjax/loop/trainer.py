"""`Trainer`: its public surface and the loop's outline. `fit` reads top to bottom: build, then
epochs of steps, logs and validation.

The Trainer has no base classes: its parts, beside it in `fitjax.loop` (the package's docstring
lists them), are built with what they need and return values; the loop (this file) is the only
writer of what lives for a fit. Sync points (where the host waits for the device) are marked;
there is none per step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import itertools
import logging
import os
import time
from typing import Any, Iterable, Iterator, Mapping, Sequence

import jax
import numpy as np

from fitjax import _seed, _status, checkpoint
from fitjax import step as step_lib
from fitjax import module as module_lib
from fitjax.loop import _arguments
from fitjax.loop import _checks as checks
from fitjax.loop import (_compile_cache, _epoch, _interrupt, _out_of_memory, _pieces, _preemption, _resume, _stop,
                         _token_ids)
from fitjax.loop._host_hooks import HostHooks
from fitjax.loop._pieces import PieceRunner
from fitjax.loop._stop import StopRequest
from fitjax.loop._plan import check_no_runs, choose_for_fit, plan_trainer
from fitjax.loop import _schedule as schedule
from fitjax.loop.config import LoopConfig
from fitjax.loop.metric_log import MetricLog
from fitjax.loop import _prompts, evaluation, generation
from fitjax._generation_options import GenerationOptions
from fitjax.loop.fit_run import Built, FitRun, step_flops, trained_variables
from fitjax.loop.train_feed import FitLoaders, TrainFeed, check_fit_loaders, epoch_options, fit_loaders
from fitjax.loop.progress import Progress, ProgressView
from fitjax.loop.stage import Stage, in_precision
from fitjax._typing import HostMetrics
from fitjax.callbacks import Callback, CallbackList, ModelCheckpoint
from fitjax.data import DataModule
from fitjax.loggers import Logger, resolve_loggers, split_by_run
from fitjax.module import LitModule, check_dataloader_idx
from fitjax.planner import Plan, planned_strategy
from fitjax.profilers import CompileTimes, Profiler, resolve_profiler
from fitjax import runs as runs_lib
from fitjax.runs import RunResults, Runs
from fitjax.state import TrainState
from fitjax.strategies import (Strategy, accelerator_banner, agree, check_host_memory, enforce_determinism,
                               in_device_memory, initialize_distributed)
from fitjax.strategies import resolve as resolve_strategy

__all__ = ["Trainer"]

log = logging.getLogger("fitjax")


class Trainer(metaclass=_arguments.CheckedArguments):
    """Trains a `LitModule`: jits one step, shards it with a strategy, logs, validates, calls back.

    The arguments have Lightning's names and meanings.

    Args:
        max_epochs: stop after this many epochs (default 1000 when `max_steps` is unset too;
            -1: no limit; 0: fit trains nothing).
        max_steps: stop after this many optimizer steps (None or -1: no limit; 0: nothing).
        max_time: stop once this much training time has passed: "DD:HH:MM:SS", a
            `datetime.timedelta` or a dict of its arguments (a `fj.Timer` is added, unless
            `callbacks` has one); the stop saves a checkpoint as an epoch's end does.
        min_epochs: a stop request (`trainer.should_stop`, `EarlyStopping`) waits until this
            many epochs are done.
        min_steps: a stop request waits until this many optimizer steps are done.
        accelerator: "auto" (JAX's default backend: TPU, then GPU, then CPU), "cpu", "gpu" or
            "tpu"; a missing backend is an error naming those present. Fit starts with one line
            saying the platform, devices used of available, processes, strategy, mesh and precision
            (the "fitjax" logger at INFO).
        strategy: "auto", "single", "dp", "zero1", "fsdp" or a `fitjax.strategies.Strategy`; or
            "plan" (a `fitjax.planner.PlannedStrategy`, which takes a memory budget): each fit
            plans every strategy on these devices (then with remat if none fits) and runs the
            fastest estimate that fits, said in one line before the banner (docs/guides/plan.md).
        devices: "auto" (all, on every process), a count, or a list of `jax.Device`. With several
            processes a count is one machine's devices (Lightning's meaning), checked.
        num_nodes: machines to run on (Lightning's meaning), checked against the cluster
            environment; None takes its count. Several processes start `jax.distributed` once,
            with the environment's numbers (`fitjax.strategies.initialize_distributed`). Only
            process 0 logs and draws progress.
        plugins: a `fj.plugins.environments.ClusterEnvironment` (in a list or alone) instead of
            the detected one (SLURM, torchrun, Kubeflow, MPI, SkyPilot, Cloud TPU, `fitjax launch`).
        callbacks: extra `Callback`s, a list or one (a progress bar is added when
            `enable_progress_bar`).
        logger: True (TensorBoard), False, a `Logger` or a list of them.
        default_root_dir: where logs (and checkpoints) go; the working directory by default.
        log_every_n_steps: log and display the train metrics' means every this many steps. The
            loop does not wait for them: they are fetched while the next steps run and reach
            the loggers (as Lightning, at row `global_step - 1`: the first row of n is at n-1) and
            the progress bar a step or two later; reading `callback_metrics` waits for them.
        val_check_interval: validate every this many train batches (int) or fraction of an epoch
            (float, rounded down to batches: an epoch may end without one); default once per
            epoch, at its end. Lightning's rules and errors (see docs/porting.md). Or a duration
            ("DD:HH:MM:SS", a `datetime.timedelta` or a dict of its arguments, Lightning 2.6):
            validate after the first train step that ends that long after the last validation
            ended (or training started), and not at epoch ends.
        check_val_every_n_epoch: validate in every n-th epoch; None: an int `val_check_interval`
            counts batches over the whole run.
        limit_train_batches: train batches per epoch: an int number or a float fraction.
        limit_val_batches: validation batches per run: an int number or a float fraction.
        limit_test_batches: test batches: an int number or a float fraction.
        limit_predict_batches: predict batches: an int number or a float fraction.
        overfit_batches: train on the same first n batches every epoch (an int, or a float
            fraction of the train batches) and validate on the first n of the validation data,
            both drawn in order: a shuffling `fj.DataLoader` or torch `DataLoader` is switched
            to its order with Lightning's warning (Lightning's `overfit_batches`; it takes the
            place of `limit_train_batches` and `limit_val_batches`). 0: off.
        reload_dataloaders_every_n_epochs: ask the datamodule's (or the module's)
            `train_dataloader()` and `val_dataloader()` again every n epochs, at the start of the
            epoch (Lightning's); loaders passed to `fit` directly are kept. 0: never.
        num_sanity_val_steps: validation batches run before training (-1: all, 0: none), so a
            validation that fails does so before the first epoch; nothing is logged.
        fast_dev_run: run 1 (or n) batches of train/val, no loggers, checkpoints, early stopping
            or sanity check — a smoke test of the code.
        enable_progress_bar: show a `RichProgressBar`.
        enable_model_summary: print a `RichModelSummary` of the parameters when fit starts.
        enable_checkpointing: add a `DefaultCheckpoint()` (under `<logger.log_dir>/checkpoints`:
            the last epoch's state at the end, epoch-end saves within 5% of the fit's time)
            unless `callbacks` has a `ModelCheckpoint`.
        seed: the run's base random key (parameter init and every rng stream); default 0. When
            given, also seeds Python's `random`, numpy's and torch's (when imported) global
            generators, as `fj.seed_everything(seed)` (a torch `DataLoader(shuffle=True)`'s order).
        precision: "32-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true", "64-true" or a
            `fitjax.Precision` (see `fitjax.precision`); "16-mixed" logs `loss_scale` and
            `skipped_steps`; "64-true" runs fit, validate, test and predict with JAX's x64 on.
        accumulate_grad_batches: micro-batches per optimizer step (their gradients summed, each
            loss divided by k, inside one jitted step). `global_step`, `max_steps`, schedules and
            `log_every_n_steps` count optimizer steps; `limit_train_batches` and
            `val_check_interval` count batches. Like Lightning, an epoch whose batch count is not
            a multiple of k ends with a step over the m < k batches left (still divided by k).
            Per-batch hooks fire once per optimizer step (Lightning: per micro-batch).
        gradient_clip_val: clip the (accumulated, unscaled) gradients at this value before the
            optimizer.
        gradient_clip_algorithm: by global norm ("norm") or elementwise ("value").
        log_grad_norm: log `train/grad_norm`, the global gradient norm before clipping.
        steps_per_execution: run this many optimizer steps per dispatch (a `lax.scan` over stacked
            batches): the same numbers, less Python and dispatch overhead for small models. Per-batch
            hooks fire once per k steps with the last step's outputs and the stacked batch; logging
            and validation happen at the first k-step boundary at or after their interval. An epoch's
            leftover steps (fewer than k) run one at a time (a second, smaller compilation).
        remat: activation rematerialization of a Linen model's layers (the submodules its root
            calls): "none", "full" (keep only each layer's inputs, recompute the rest in the
            backward pass), "dots" (also keep the weight products) or "offload" (keep those in
            host memory). Less activation memory for more FLOPs or transfers, the same numbers
            (`fitjax.step.remat`; `trainer.plan` shows both).
        offload: train state kept in the devices' host memory (memory kind "pinned_host") between
            steps: "none", "optimizer" (the optimizer state) or "optimizer+master" (the parameters
            in their storage dtype too: "bf16-mixed"'s float32 master weights). Each step copies
            them in and back (XLA overlaps the transfers where it can); the same numbers, less
            device memory beside the activations (`fitjax.step.offload`; `fitjax plan` counts them
            as host memory). Raises where the devices have no host memory kind.
        update_in_backward: apply the optimizer's update to each layer inside the backward pass, as
            soon as that layer's gradient exists (torchtune's `optimizer_in_bwd`): the whole-model
            gradient is never held, one layer's at a time (Llama-3.2-3B's full fine-tune, bf16-true,
            8-bit moments, 1 x 1024 on one v5e chip: planned 20.46 GiB without, 15.20 GiB with).
            For a model whose layers are one scan (`fitjax.models.CausalLMModule(scan_layers=True)`)
            and an optimizer that updates each parameter alone (`fj.optim.adamw`, any moments;
            checked); each layer is recomputed in its backward step as with remat="full". Not with
            gradient accumulation, a global-norm clip, loss scaling ("16-mixed"), detect_anomaly,
            offload, or callbacks that need the whole gradient (each raises, saying why); the
            logged loss and `grad_norm` are the usual step's (`fitjax.step.in_backward`).
        detect_anomaly: check every step for a non-finite loss, gradients or parameters and raise
            naming the step and the quantity (a host sync per step: for debugging).
        profiler: None, "simple" (host wall time per phase, a table when fit ends, also in
            `<log_dir>/fit-profile.txt`), "jax" (a `jax.profiler` trace of train steps 2-4 under
            `<log_dir>/plugins/profile/` for TensorBoard) or a `fitjax.profilers.Profiler`.
            Every fit also logs each XLA program's compile seconds as `compile/<program>_s`
            (TensorBoard: a table in its Text tab).
        compile_cache: JAX's persistent compilation cache, so a second run of the same script
            reads its programs back instead of compiling them: True (default: in
            `$XDG_CACHE_HOME/fitjax/xla`, else `~/.cache/fitjax/xla`, bounded to 4 GiB, programs
            that compile in under a second not stored), a folder, or False (off). Turned on when
            the trainer first compiles, never at import; `FITJAX_COMPILE_CACHE=0` turns it off
            for every trainer, `FITJAX_COMPILE_CACHE=<folder>` moves fitjax's folder. A cache you
            configured yourself (`JAX_COMPILATION_CACHE_DIR`, `jax.config`) is left as it is
            (docs/guides/speed.md).
        deterministic: make two runs of the same code bitwise identical (see `fitjax.strategies._determinism`).
        benchmark: Lightning's flag, no JAX meaning (XLA picks its kernels when it compiles);
            accepted so Lightning configs run. This and the next three log one line saying what
            JAX does instead when set to other than Lightning's default.
        inference_mode: Lightning's flag, no JAX meaning (eval computes no gradients).
        sync_batchnorm: Lightning's flag, no JAX meaning (BatchNorm over a batch sharded on the
            devices is global already).
        use_distributed_sampler: Lightning's flag, no JAX meaning (the strategy splits batches).
        runs: train several runs side by side in one program (one jitted step vmapped over them,
            on the same batches): a count (`runs=5`: run i from seed `seed + i`) or a list of
            hyperparameter dicts (`runs=[{"lr": 1e-3}, {"lr": 3e-3}]`, each from `seed` unless
            it has a "seed"), which the module reads through `self.hparams` in `loss`, `metrics`
            and `configure_optimizer` (values that differ are traced arrays; one used as a shape
            is refused). Every logged value is per run: `train/loss/run_<i>`. See
            docs/guides/many_runs.md.

    Example:
        >>> import fitjax as fj
        >>> trainer = fj.Trainer(max_epochs=3, strategy="dp", log_every_n_steps=10)
        >>> # trainer.fit(MyModule(), fj.DataLoader(train, batch_size=64, shuffle=True), val_loader)
    """

    def __init__(
        self,
        *,
        max_epochs: int | None = None,
        max_steps: int | None = None,
        max_time: Any = None,
        min_epochs: int | None = None,
        min_steps: int | None = None,
        accelerator: str = "auto",
        strategy: str | Strategy = "auto",
        devices: Any = "auto",
        num_nodes: int | None = None,
        plugins: Any = None,
        callbacks: Iterable[Callback] | None = None,
        logger: bool | Logger | Sequence[Logger] = True,
        default_root_dir: str | os.PathLike | None = None,
        log_every_n_steps: int = 50,
        val_check_interval: int | float | None = None,
        check_val_every_n_epoch: int | None = 1,
        limit_train_batches: int | float | None = None,
        limit_val_batches: int | float | None = None,
        limit_test_batches: int | float | None = None,
        limit_predict_batches: int | float | None = None,
        overfit_batches: int | float = 0.0,
        reload_dataloaders_every_n_epochs: int = 0,
        num_sanity_val_steps: int = 2,
        fast_dev_run: bool | int = False,
        enable_progress_bar: bool = True,
        enable_model_summary: bool = True,
        enable_checkpointing: bool = True,
        seed: int | None = None,
        precision: Any = "32-true",
        accumulate_grad_batches: int = 1,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str = "norm",
        log_grad_norm: bool = False,
        steps_per_execution: int = 1,
        remat: str = "none",
        offload: str = "none",
        update_in_backward: bool = False,
        detect_anomaly: bool = False,
        deterministic: bool = False,
        profiler: str | Profiler | None = None,
        compile_cache: bool | str | os.PathLike = True,
        benchmark: bool | None = None,
        inference_mode: bool = True,
        sync_batchnorm: bool = False,
        use_distributed_sampler: bool = True,
        runs: int | Sequence[Mapping[str, Any]] | None = None,
    ):
        # the loop's arguments, checked once, with fast_dev_run's and overfit_batches' rewrites
        self._config = LoopConfig.create(
            max_epochs=max_epochs, max_steps=max_steps, max_time=max_time, min_epochs=min_epochs,
            min_steps=min_steps, num_sanity_val_steps=num_sanity_val_steps, log_every_n_steps=log_every_n_steps,
            check_val_every_n_epoch=check_val_every_n_epoch, val_check_interval=val_check_interval,
            limit_train_batches=limit_train_batches, limit_val_batches=limit_val_batches,
            limit_test_batches=limit_test_batches, limit_predict_batches=limit_predict_batches,
            fast_dev_run=fast_dev_run, overfit_batches=overfit_batches,
            reload_dataloaders_every_n_epochs=reload_dataloaders_every_n_epochs, seed=seed)
        if self._config.fast_dev_run:
            logger = False  # Lightning's: a smoke test logs nothing
        _arguments.lightning_flags(benchmark=benchmark, inference_mode=inference_mode, sync_batchnorm=sync_batchnorm,
                                   use_distributed_sampler=use_distributed_sampler)
        if seed is not None:  # Lightning's `seed_everything(seed)`: Python, numpy, torch (when imported)
            _seed.seed_host(seed % 2**32, import_torch=False)
        checks.flags(enable_progress_bar=enable_progress_bar, enable_model_summary=enable_model_summary,
                     enable_checkpointing=enable_checkpointing, log_grad_norm=log_grad_norm,
                     detect_anomaly=detect_anomaly, deterministic=deterministic)
        self.step_options = step_lib.StepOptions.create(
            precision=precision, accumulate_grad_batches=accumulate_grad_batches,
            gradient_clip_val=gradient_clip_val, gradient_clip_algorithm=gradient_clip_algorithm,
            steps_per_execution=steps_per_execution, detect_anomaly=detect_anomaly,
            log_grad_norm=log_grad_norm, remat=remat, offload=offload, update_in_backward=update_in_backward,
        )
        self._planned_remat = self.step_options.remat  # strategy="plan" may turn remat on; this is the user's
        self.deterministic = enforce_determinism(deterministic)
        self.profiler: Profiler = resolve_profiler(profiler)
        self._compile_times = CompileTimes()  # compile/<program>_s, logged with the next values
        self._compile_cache = _compile_cache.check_setting(compile_cache)  # turned on at the first compile

        # before anything asks JAX for devices
        self.cluster_environment = initialize_distributed(num_nodes, devices=devices, plugins=plugins)
        self.devices = checks.select_devices(devices, accelerator)
        if self.step_options.offload != "none":
            check_host_memory(self.devices, f"Trainer(offload={self.step_options.offload!r})")
        # strategy="plan": dp until each fit asks the planner (`_plan.choose_for_fit`)
        self._planned = planned_strategy(strategy)
        self.strategy = resolve_strategy("auto" if self._planned else strategy, num_devices=len(self.devices))
        self.strategy.setup(self.devices)
        self.default_root_dir = checks.root_dir(default_root_dir)
        self.loggers: list[Logger] = resolve_loggers(logger, default_root_dir=self.default_root_dir)

        self.callbacks: list[Callback] = checks.trainer_callbacks(
            callbacks, progress_bar=enable_progress_bar, model_summary=enable_model_summary,
            checkpointing=enable_checkpointing, max_time=max_time, fast_dev_run=self._config.fast_dev_run)
        # pieces the callbacks add around the step (an EMA): one more entry of the state each
        self.step_options = dataclasses.replace(self.step_options, pieces=step_lib.pieces.check_pieces(
            [piece for cb in self.callbacks for piece in cb.step_pieces()]))
        self._runs = Runs.create(runs, seed=self.seed)  # several runs side by side, or None
        if self._runs is not None:
            self._runs.check_options(self.strategy, self.step_options)
            if self._planned is not None:
                check_no_runs(self._runs, "Trainer(strategy='plan')")
        # accumulate_grad_batches by epoch (a GradientAccumulationScheduler), or None
        self._accumulation = checks.accumulation_schedule(self.callbacks, accumulate_grad_batches)

        # The loop's position: one object, read by callbacks through `trainer.progress`.
        self._progress = Progress()
        self._progress_view = ProgressView(self._progress)  # one view: callbacks read it every step
        self._stop_request = StopRequest()  # `should_stop` and the last signal stop (`_stop`)
        # the logged values (`callback_metrics`, ...), the train log windows, the epoch's means
        # with runs, the loggers that can write a folder per run do, and the results see every row
        self._run_results = None if self._runs is None else RunResults(self._runs.names)
        self._log_to = self.loggers if self._runs is None else [
            *split_by_run(self.loggers, self._runs.names, self._runs.run_hparams, stops=self._run_results.stops),
            self._run_results]
        self._metric_log = MetricLog(self._log_to, profiler=self.profiler, compile_times=self._compile_times,
                                     progress=self._progress_view, on_window_logged=self._progress.logged,
                                     on_timed=self._progress.timed,
                                     log_every_n_steps=self.log_every_n_steps)
        # the one way hooks are called; what they log goes to the metric log (not in the sanity check)
        self._hooks = HostHooks(CallbackList(self.callbacks), self._host_variables, self._metric_log.log_hook,
                                muted=lambda: self.sanity_checking)
        self.num_val_batches: list[int | None] = []
        self._step_flops: dict[str, float | None] = {}  # remat -> flops, once `train_step_flops` compiled them
        self._interrupted = False  # the last fit ended by an exception (Ctrl-C included)
        self._stage = Stage()  # what runs now, for the hooks (`trainer.stage`); replaced, never changed
        self._train_size_known = False  # fit has measured its train data (`estimated_stepping_batches`)
        self._run: FitRun | None = None  # while fitting: everything that lives for the fit
        # where an epoch cut short by max_steps stood before its end work: what a save after it resumes
        self._cut_point: _resume.ResumePoint | None = None
        self._built: Built | None = None  # what the last fit/validate/test/predict built, for the next
        self._lightning_module: LitModule | None = None  # the module of the last fit/validate/test/predict

    # ------------------------------------------------------------ the configuration (read-only)
    # each is the `LoopConfig` field of its name; setting one says it is fixed when the Trainer is made

    @property
    def max_epochs(self) -> int | None:
        """Epochs fit trains at most (None: no limit; 1000 when nothing else bounds the run)."""
        return self._config.max_epochs

    @max_epochs.setter
    def max_epochs(self, value: Any) -> None:
        raise checks.fixed_argument("max_epochs")

    @property
    def max_steps(self) -> int | None:
        """Optimizer steps fit takes at most (None: no limit)."""
        return self._config.max_steps

    @max_steps.setter
    def max_steps(self, value: Any) -> None:
        raise checks.fixed_argument("max_steps")

    @property
    def min_epochs(self) -> int | None:
        """A stop request waits until this many epochs are done (None: no minimum)."""
        return self._config.min_epochs

    @min_epochs.setter
    def min_epochs(self, value: Any) -> None:
        raise checks.fixed_argument("min_epochs")

    @property
    def min_steps(self) -> int | None:
        """A stop request waits until this many optimizer steps are done (None: no minimum)."""
        return self._config.min_steps

    @min_steps.setter
    def min_steps(self, value: Any) -> None:
        raise checks.fixed_argument("min_steps")

    @property
    def num_sanity_val_steps(self) -> int:
        """Validation batches fit runs before training (-1: all, 0: none)."""
        return self._config.num_sanity_val_steps

    @num_sanity_val_steps.setter
    def num_sanity_val_steps(self, value: Any) -> None:
        raise checks.fixed_argument("num_sanity_val_steps")

    @property
    def log_every_n_steps(self) -> int | None:
        """Train metrics are logged every this many optimizer steps."""
        return self._config.log_every_n_steps

    @log_every_n_steps.setter
    def log_every_n_steps(self, value: Any) -> None:
        raise checks.fixed_argument("log_every_n_steps")

    @property
    def check_val_every_n_epoch(self) -> int | None:
        """Fit validates in every n-th epoch (None: an int `val_check_interval` counts batches over the whole
        run)."""
        return self._config.check_val_every_n_epoch

    @check_val_every_n_epoch.setter
    def check_val_every_n_epoch(self, value: Any) -> None:
        raise checks.fixed_argument("check_val_every_n_epoch")

    @property
    def val_check_interval(self) -> int | float | datetime.timedelta | None:
        """Validate every this many train batches (int), fraction of an epoch (float) or duration
        (`datetime.timedelta`); None: once an epoch."""
        return self._config.val_check_interval

    @val_check_interval.setter
    def val_check_interval(self, value: Any) -> None:
        raise checks.fixed_argument("val_check_interval")

    @property
    def limits(self) -> Mapping[str, int | float | None]:
        """Each stage's batch limit, read-only: `limits["train"]` is `limit_train_batches` (or `fast_dev_run`'s,
        `overfit_batches`' count), likewise "val", "test", "predict"."""
        return self._config.limits

    @limits.setter
    def limits(self, value: Any) -> None:
        raise checks.fixed_argument("limits", "limit_train_batches=..., limit_val_batches")

    @property
    def fast_dev_run(self) -> int:
        """Batches of every stage in a smoke test (0: off)."""
        return self._config.fast_dev_run

    @fast_dev_run.setter
    def fast_dev_run(self, value: Any) -> None:
        raise checks.fixed_argument("fast_dev_run")

    @property
    def overfit_batches(self) -> int | float:
        """The same first train and validation batches every epoch (0: off)."""
        return self._config.overfit_batches

    @overfit_batches.setter
    def overfit_batches(self, value: Any) -> None:
        raise checks.fixed_argument("overfit_batches")

    @property
    def reload_dataloaders_every_n_epochs(self) -> int | None:
        """Fit asks the loader hooks again every n epochs (0: never)."""
        return self._config.reload_dataloaders_every_n_epochs

    @reload_dataloaders_every_n_epochs.setter
    def reload_dataloaders_every_n_epochs(self, value: Any) -> None:
        raise checks.fixed_argument("reload_dataloaders_every_n_epochs")

    @property
    def seed(self) -> int:
        """The run's base random key (parameter init and every rng stream)."""
        return self._config.seed

    @seed.setter
    def seed(self, value: Any) -> None:
        raise checks.fixed_argument("seed")

    @property
    def runs(self) -> Runs | None:
        """The runs trained side by side (`Trainer(runs=...)`): each one's seed, hyperparameters
        and name; None for one run."""
        return self._runs

    @runs.setter
    def runs(self, value: Any) -> None:
        raise checks.loop_sets("runs")

    @property
    def run_results(self) -> RunResults | None:
        """With `Trainer(runs=...)`: each run's final logged values (`.final[i]`), its values where
        its `val/loss` (else `train/loss_epoch`) was lowest (`.best[i]`) and the table fit logs
        at its end (`.table()`); None for one run."""
        return self._run_results

    @run_results.setter
    def run_results(self, value: Any) -> None:
        raise checks.loop_sets("run_results")

    def stop_run(self, run: int) -> None:
        """With `Trainer(runs=...)`, during fit: stops run `run` (an early stop of one run, as
        `EarlyStopping` asks): from the next step its parameters, optimizer and model state stay
        as they are while the other runs go on; once every run is stopped, fit stops."""
        if self._runs is None or self._run is None or self._run.state is None:
            raise RuntimeError("Trainer.stop_run(run) stops one run of a Trainer(runs=...) fit, while it fits.")
        if isinstance(run, bool) or not isinstance(run, int) or not 0 <= run < self._runs.size:
            raise ValueError(f"Trainer.stop_run(run=...) takes a run index from 0 to {self._runs.size - 1}, got {run!r}.")
        self._run.state = runs_lib.stop_run(self._run.state, run)
        # its logs end here: the row of the step just run is its last (the loggers' run folders, the table)
        self._run_results.stops.stop(run, last_row=self.global_step - 1, epoch=self.current_epoch)
        if not any(runs_lib.active_runs(self._run.state)):  # sync point: only when a run stops
            self.should_stop = True

    @property
    def best_run(self) -> int | None:
        """With `Trainer(runs=...)`: the index of the run whose `val/loss` (else
        `train/loss_epoch`) was the lowest of all runs at any log; None for one run or before."""
        return None if self._run_results is None else self._run_results.best_run

    # ------------------------------------------------------------------------------ properties

    @property
    def logger(self) -> Logger | None:
        """The first logger (Lightning's `trainer.logger`)."""
        return self.loggers[0] if self.loggers else None

    @property
    def lightning_module(self) -> LitModule | None:
        """The module of the last `fit`, `validate`, `test` or `predict` (Lightning's
        `trainer.lightning_module`); None before any."""
        return self._lightning_module

    @lightning_module.setter
    def lightning_module(self, value: Any) -> None:
        raise checks.loop_sets("lightning_module")

    @property
    def log_dir(self) -> str:
        """Where the first logger writes (its version folder), else `default_root_dir`: a str,
        as Lightning's `trainer.log_dir`."""
        log_dir = self.logger.log_dir if self.logger is not None else None
        return str(log_dir if log_dir is not None else self.default_root_dir)

    @property
    def precision(self) -> str:
        """The precision policy's name, e.g. "16-mixed" (Lightning's `trainer.precision`)."""
        return self.step_options.precision.name

    @precision.setter
    def precision(self, value: Any) -> None:
        raise checks.loop_sets("precision")

    @property
    def checkpoint_callbacks(self) -> list[ModelCheckpoint]:
        return [cb for cb in self.callbacks if isinstance(cb, ModelCheckpoint)]

    @property
    def checkpoint_callback(self) -> ModelCheckpoint | None:
        """The first `ModelCheckpoint` (Lightning's `trainer.checkpoint_callback`)."""
        return next(iter(self.checkpoint_callbacks), None)

    @property
    def is_global_zero(self) -> bool:
        """True on process 0 (the one that logs and draws progress)."""
        return jax.process_index() == 0

    @property
    def progress(self) -> ProgressView:
        """The loop's position, read-only: epoch, global step, batches done, what was last
        logged/validated/saved, and `crossed(n)` to schedule work every n steps (see
        `fitjax.loop.progress`)."""
        return self._progress_view

    @progress.setter
    def progress(self, value: Any) -> None:
        raise checks.loop_sets("progress")

    @property
    def stage(self) -> Stage:
        """What runs now, read-only: its name ("fit", "validate", "test", "predict" or None),
        whether it is fit's sanity check, and `validate`/`test`'s `verbose=`."""
        return self._stage

    @stage.setter
    def stage(self, value: Any) -> None:
        raise checks.loop_sets("stage")

    @property
    def sanity_checking(self) -> bool:
        """True while fit's sanity check runs its validation batches (Lightning's flag)."""
        return self._stage.sanity_checking

    @sanity_checking.setter
    def sanity_checking(self, value: Any) -> None:
        raise checks.loop_sets("sanity_checking")

    @property
    def accumulate_grad_batches(self) -> int:
        """Batches per optimizer step now (Lightning's; a `GradientAccumulationScheduler` changes
        it at the epochs it names)."""
        return self._step_options_now.accumulate_grad_batches

    @property
    def _step_options_now(self) -> step_lib.StepOptions:
        """The step options of the current epoch (an accumulation schedule changes the count),
        or of the last one trained once fit is done."""
        if self._run is not None:
            return self._run.feed.options
        return self._built.compiled.options if self._built is not None else self.step_options

    @property
    def state(self) -> TrainState | None:
        """The train state (`fitjax.TrainState`: params, optimizer state, model state, rng,
        step, extras): the fit's while it runs, the last fit's after it; None before any fit
        (and after an evaluation stage that built programs for another module)."""
        if self._run is not None:
            return self._run.state
        return self._built.state if self._built is not None else None

    @property
    def should_stop(self) -> bool:
        """Set True to stop the fit (Lightning's `trainer.should_stop`): after this step, or with
        several processes at the next sync point (log step, validation, epoch end), once
        `min_epochs`/`min_steps` are met; fit clears it when it starts. (The batch loop reads
        the request itself, `_stop.StopRequest`: no call per step.)"""
        return self._stop_request.requested

    @should_stop.setter
    def should_stop(self, value: bool) -> None:
        self._stop_request.requested = value

    @property
    def interrupted(self) -> bool:
        """True when the last fit ended by an exception, Ctrl-C included (Lightning's flag: its
        status `INTERRUPTED`); False while a fit runs and after one that finished."""
        return self._interrupted

    @interrupted.setter
    def interrupted(self, value: Any) -> None:
        raise checks.loop_sets("interrupted")

    @property
    def received_sigterm(self) -> bool:
        """True once SIGTERM asked this fit to stop (Lightning's flag); after the processes
        agreed on the stop, True on all of them when the agreed reason was SIGTERM."""
        if self._stop_request.sigterm is not None:
            return self._stop_request.sigterm
        return self._run is not None and self._run.stopping.requested == "SIGTERM"

    @property
    def _in_use(self) -> Built | None:
        """The compiled programs in use, with the module and batch they were built for: the
        fit's once it has built them, else the last fit's or evaluation's."""
        return (self._run.built() if self._run is not None else None) or self._built

    @property
    def global_step(self) -> int:
        """Optimizer steps taken (Lightning's `trainer.global_step`)."""
        return self._progress.global_step

    @global_step.setter
    def global_step(self, value: Any) -> None:
        raise checks.loop_sets("global_step")

    @property
    def current_epoch(self) -> int:
        """The current epoch, 0-based (Lightning's `trainer.current_epoch`)."""
        return self._progress.epoch

    @current_epoch.setter
    def current_epoch(self, value: Any) -> None:
        raise checks.loop_sets("current_epoch")

    @property
    def num_training_batches(self) -> int | None:
        """Train batches per epoch after `limit_train_batches` (None: the data has no length)."""
        return self._progress.batches_in_epoch

    @num_training_batches.setter
    def num_training_batches(self, value: Any) -> None:
        raise checks.loop_sets("num_training_batches")

    @property
    def callback_metrics(self) -> HostMetrics:
        """The latest value of every logged key (host floats), as callbacks and `EarlyStopping` /
        `ModelCheckpoint` read them.

        As in Lightning, the values logged on step are the last train step's after every step
        (kept on the device by the loop and read here, once per step, when someone reads them).
        They include the train log window on its way to the host, if any: the values are those
        of every log step so far. Reading waits for the device only on the first read after a
        log step, and only when the copy has not arrived yet; it writes nothing (the loop logs
        the window at its next step). The loop itself and the progress bar never read it per step.
        """
        return self._metric_log.callback_metrics

    @callback_metrics.setter
    def callback_metrics(self, value: Any) -> None:
        raise checks.loop_sets("callback_metrics")

    @property
    def logged_metrics(self) -> HostMetrics:
        """The latest value of every key written to the loggers (Lightning's), the rows on their
        way to them included (reading waits for those, as `callback_metrics` does)."""
        return self._metric_log.logged_metrics

    @logged_metrics.setter
    def logged_metrics(self, value: Any) -> None:
        raise checks.loop_sets("logged_metrics")

    @property
    def progress_bar_metrics(self) -> HostMetrics:
        """The values the progress bar shows: the train window's last means and what was
        logged with `prog_bar=True` (Lightning's)."""
        return self._metric_log.progress_bar_metrics

    @progress_bar_metrics.setter
    def progress_bar_metrics(self, value: Any) -> None:
        raise checks.loop_sets("progress_bar_metrics")

    @property
    def estimated_stepping_batches(self) -> int | float:
        """The optimizer steps this fit takes at most (Lightning's): `max_steps` when set, else
        ceil(train batches per epoch / `accumulate_grad_batches`) x `max_epochs`, capped by
        `max_steps`; `math.inf` when neither bounds the run. The batch count is known once fit
        has its train data: from `on_fit_start` on (and in `configure_optimizer`, which fit
        calls after that), and after fit.
        """
        return schedule.stepping_batches(self._config, self.num_training_batches, self.accumulate_grad_batches,
                                         size_known=self._train_size_known)

    def _host_variables(self, module: LitModule) -> tuple | None:
        """`(params, model_state, rng)` host calls of the model use now: the train state's (its
        eval parameters outside train mode), else the module's own; None before either exists."""
        state = self.state
        if state is not None and self._in_use.module is module:
            params = state.params if module.training else self._eval_params()
            return params, state.model_state, state.rng
        return module_lib.own_variables(module)

    def _eval_params(self):
        """The parameters eval uses: an averaged copy when a piece asks (`EMA(use_for_eval=True)`)."""
        return step_lib.pieces.eval_params(self.state, self.step_options.pieces)

    def train_step_flops(self, *, remat: str | None = None) -> float | None:
        """Floating-point operations of one optimizer step on each device, as XLA counts them.

        XLA's cost analysis of the train step compiled as it runs (this strategy's partitioned
        program, precision, accumulation, clipping, optimizer: everything the step does), with
        its loops unrolled so every micro-batch counts; divided by `steps_per_execution`. Known
        once fit has built its step (from `on_fit_start` on, and after fit). Read after a step
        ran, it is the analysis of the program that ran (batches kept on the devices: with their
        pick, a few FLOPs), nothing compiled again; read before, the step is compiled once for
        the count (no step runs). None where the backend reports no FLOPs.
        Custom calls (a cuDNN attention kernel) are opaque to the analysis: their FLOPs are not
        counted. `remat="none"` counts the same step without rematerialization: the model's
        FLOPs when `Trainer(remat=...)` recomputes layers (one more compilation), which
        `ThroughputMonitor`'s MFU uses; None counts the step as it runs (the hardware's FLOPs).
        """
        built = self._in_use
        compiled = built.compiled if built is not None else None
        if compiled is None or compiled.train_step_cost is None:
            raise RuntimeError("trainer.train_step_flops() is known once Trainer.fit has built its train "
                               "step: read it from on_fit_start or later.")
        remat = compiled.options.remat if remat is None else step_lib.remat.check_remat(remat)
        if remat not in self._step_flops:  # compiled once a fit
            self._step_flops[remat] = step_flops(compiled, remat)
        return self._step_flops[remat]

    def agree(self, flag: bool) -> bool:
        """True on every process when `flag` is True on any (free with one process).

        Decisions taken from host-local facts (time, signals) must pass through this, at a
        place every process reaches, or one process leaves the loop while the others wait for
        it in a collective.
        """
        return agree(flag)

    # --------------------------------------------------------------------------------- fit

    def fit(
        self,
        module: LitModule | None = None,
        train_data: Any = None,
        val_data: Any = None,
        *,
        datamodule: DataModule | None = None,
        ckpt_path: str | os.PathLike | None = None,
        model: LitModule | None = None,
        train_dataloaders: Any = None,
        val_dataloaders: Any = None,
    ) -> None:
        """Trains `module` on `train_data`, validating on `val_data` (both optional with a datamodule).

        Data may be a `fj.DataLoader`, a torch `DataLoader`, a grain dataset, or any re-iterable
        of batches (pytrees of arrays). `val_data` may be several loaders (a list, tuple or dict
        of them, as Lightning takes them): each validation runs them in turn and their values are
        logged as `<key>/dataloader_idx_<i>`. `ckpt_path` ("last", "best" or a checkpoint folder)
        resumes exactly where that checkpoint stopped; "hpc" from the newest `hpc_ckpt_<n>` in
        `default_root_dir`. Without it, a process `fitjax launch --max-restarts` restarted
        resumes from the newest complete checkpoint. SIGTERM stops every process after one
        agreed step, saves a checkpoint there and returns (`trainer.received_sigterm` is then True).

        Lightning's spellings work too: `model=`, `train_dataloaders=`, `val_dataloaders=`, a
        datamodule passed as `train_data` (`fit(model, dm)`), and no data at all when the module
        defines `train_dataloader()` (and `val_dataloader()`).
        """
        with _interrupt.graceful():  # Ctrl-C: Lightning's line, the exception hooks and their save, exit 130
            module, train_data, val_data, datamodule = _arguments.fit_arguments(
                module, model, train_data, train_dataloaders, val_data, val_dataloaders, datamodule)
            checks.check_module(module)
            _compile_cache.use(self._compile_cache)  # before the first compilation (strategy="plan"'s)
            self._lightning_module = module
            module.trainer = self  # Lightning's `self.trainer` (estimated_stepping_batches in configure_optimizer)
            loaders = self._fit_loaders(module, train_data, val_data, datamodule, resuming=ckpt_path is not None)
            ckpt_path = _preemption.auto_resume_path(self, ckpt_path)  # "hpc", a requeued job, a launch restart
            ckpt_path = _resume.resolve_ckpt_path(self, ckpt_path, where="Trainer.fit(ckpt_path=...)")
            for logger in self.loggers:  # before anything (config, profiler, checkpoints) uses log_dir
                logger.claim_version()
            self._stage = Stage("fit")
            self._hooks.call("setup", self, module, "fit")
            self.profiler.setup("fit", log_dir=self.log_dir or self.default_root_dir)
            hooks, self._hooks = self._hooks, self._hooks.wrapped(self.profiler.wrap_hooks)  # unchanged when off
            self._stop_request.start_fit()
            self._interrupted, self._cut_point = False, None
            feed = TrainFeed(loaders.train, limit=self.limits["train"], strategy=self.strategy,
                             options=self._epoch_options(self.current_epoch, module))
            run = None
            try:
                with _preemption.stop_on_signals(self.cluster_environment, lambda: self.state) as stopping, \
                        self._compile_times, self.step_options.precision.context(), \
                        module_lib.hook_mode(module, True):  # Lightning's train mode for the hooks
                    run = self._run = FitRun(module, loaders, feed, stopping)
                    with _out_of_memory.explained(self, run):  # what fits instead, from the planner
                        self._fit(run, ckpt_path)
            except BaseException as exc:
                _interrupt.begin(exc)  # Ctrl-C: Lightning's line; a further Ctrl-C waits for the save
                self._interrupted = True
                self._hooks.call("on_exception", self, module, exc)
                stopped = isinstance(exc, (KeyboardInterrupt, _resume.Preempted))
                self._metric_log.finalize("interrupted" if stopped else "failed")
                if isinstance(exc, _resume.Preempted):
                    return  # saved by the checkpoint callbacks: a clean stop
                raise
            finally:
                self._metric_log.end_fit()  # values of an interrupted window are not logged
                self._hooks.call("teardown", self, module, "fit")
                self._hooks = hooks
                self._stage = Stage()
                self._run = None  # the fit's data on the devices, its feeds and counters go with it
                if run is not None:
                    self._built = run.built() or self._built
                self.profiler.describe()
                self.profiler.teardown("fit")
                if run is not None and run.requeue_from is not None:
                    _preemption.requeue_job(run.requeue_from)  # last: SLURM ends this job once it is requeued
            self._metric_log.finalize("success")

    def plan(self, module: LitModule, train_data: Any = None, *, datamodule: DataModule | None = None,
             target: str = "local", sweep: bool | Mapping[str, Sequence] = False, memory_bytes: int | None = None,
             headroom: float = 0.1, strategy: str | Strategy | None = None) -> Plan:
        """Will it fit, and how fast: the train step `fit` would run, compiled for `target` and
        measured, never run (nothing is allocated; the module and trainer are left as they were).

        Reports per candidate, per device: memory (parameters, optimizer state, other state,
        the batch, temporaries: gradients and activations; the peak, from XLA's memory analysis)
        and whether it fits the device's memory with `headroom` of it kept free; model FLOPs
        (its `flops_per_batch`, else 6N + attention for a module declaring `transformer_shape`,
        else XLA's count) and XLA's FLOPs; the bytes each kind of collective moves; a roofline
        estimate of the step's time and MFU from the device kind's peak figures. See
        docs/guides/plan.md.

        Args:
            module: the `LitModule`, as for `fit` (left as it was).
            train_data: as for `fit` (only the first batch's shapes and dtypes are used), or
                that batch as `jax.ShapeDtypeStruct`s (`{"tokens": ShapeDtypeStruct((16, 4097),
                jnp.int32)}`).
            datamodule: or a `DataModule`, as for `fit`.
            target: "local" (this trainer's devices), a TPU slice ("tpu-v5e-16", "tpu-v4-8",
                "tpu-v5p-128", "tpu-v6e-256"...: compiled deviceless with libtpu, `pip install
                'fitjax[tpu-plan]'`), or a GPU kind ("gpu-h100") on a machine with that GPU.
            sweep: False: the trainer as configured; True: also other strategies and meshes,
                remat and micro-batches with accumulation; or `{axis: [values]}` (axes
                "strategy", "accumulate", "precision", "remat", "offload").
            memory_bytes: memory per device to fit in (default: the device's, or the device
                kind's from the table; none on CPU).
            headroom: the fraction of the memory kept free (fragmentation, the runtime).
            strategy: plan this strategy instead of the trainer's, its mesh built over the
                target's devices, not this machine's: "auto" is "dp" over a slice's chips, and
                `FSDP(fsdp=4, tensor=2)` plans for "tpu-v5e-8" from a laptop with one device
                (`fj.plan` and `fitjax plan` pass a target's strategy this way).

        Returns:
            A `fitjax.planner.Plan`: `print(plan)` shows the table, `plan.as_dict()` the figures,
            `plan.recommended` the fastest candidate that fits and `plan.reason` why.
        """
        return plan_trainer(self, module, train_data, datamodule, target=target, sweep=sweep,
                            memory_bytes=memory_bytes, headroom=headroom, strategy=strategy)

    def _fit_loaders(self, module: LitModule, train_data, val_data, datamodule, *, resuming: bool) -> FitLoaders:
        """Fit's loaders, checked against the strategy's devices, once the strategy is chosen
        (`strategy="plan"`: the fastest planned one that fits, said why) and said in one line."""
        if self._planned is not None:
            choice = choose_for_fit(self._planned, module, train_data, datamodule, self.devices,
                                    dataclasses.replace(self.step_options, remat=self._planned_remat))
            self.strategy, self.step_options = choice.strategy, choice.options
            if jax.process_index() == 0:
                log.info(f"fitjax: {choice.line}")
        if jax.process_index() == 0:  # said before the first batch and the compilation: the slow parts
            log.info(accelerator_banner(self.devices, self.strategy, self.step_options.precision,
                                        self.cluster_environment))
        loaders = self._run_loaders(fit_loaders(module, train_data, val_data, datamodule,
                                                overfit=bool(self.overfit_batches)))
        check_fit_loaders(loaders, module, shards=self.strategy.num_batch_shards, limits=self.limits,
                          max_steps=self.max_steps, accumulate=self.step_options.accumulate_grad_batches,
                          resuming=resuming, validates=schedule.validation_enabled(self._config, loaders.val))
        return loaders

    def _fit(self, run: FitRun, ckpt_path=None) -> None:
        module, feed = run.module, run.feed
        self.should_stop = False
        first, epoch_iter = feed.first_batch(self.current_epoch)
        _token_ids.check_batch(first, _token_ids.vocab_size(module), where="the first train batch")
        self._progress.batches_in_epoch = feed.batches_in_epoch
        self._train_size_known = True
        with self.profiler.profile("[build] state and programs"), \
                _status.phase("initialising the state", "initialised the state"):
            run.build(first, strategy=self.strategy, seed=self.seed, runs=self._runs)
        self._step_flops = {}
        self._metric_log.begin_fit(run.compiled.log_specs)
        run.pieces = PieceRunner(self.step_options.pieces, self.strategy, run.compiled.state_shardings)
        feed.keep_on_devices(run.state.params)
        epoch_iter = itertools.chain([first], epoch_iter)
        if ckpt_path is not None:  # state, progress, data position, callback and logger states
            epoch_iter = _resume.resume_fit(run, ckpt_path, trainer=self, progress=self._progress,
                                            metric_log=self._metric_log, hooks=self._hooks, callbacks=self.callbacks,
                                            loggers=self.loggers, precision=self.precision)
        if self._runs is not None:  # which runs train (a resumed state keeps its stopped runs stopped)
            self._run_results.stops.begin_fit(runs_lib.active_runs(run.state), last_row=self.global_step - 1)
        # a resumed run with other hyperparameters: its version's hparams.yaml stays as it was
        kept = ckpt_path is not None and _resume.warn_changed_hparams(ckpt_path, module)
        for logger in self._log_to if not kept else ():
            logger.log_hyperparams(dict(module.hparams))
        run.val_every = schedule.val_check_batches(self._config, self.num_training_batches, run.loaders.val)
        checks.warn_short_epoch(self, self.num_training_batches)
        self._hooks.call("on_fit_start", self, module)
        self._sanity_check(run)
        if not schedule.skip_training(self._config, self.progress, should_stop=self.should_stop):
            run.last_val_time = time.monotonic()  # a time-based val_check_interval counts from here
            self._hooks.call("on_train_start", self, module)
            loaded_at = self.current_epoch  # when the loaders were last asked for
            while not schedule.done_training(self._config, self.progress, should_stop=self.should_stop):
                if schedule.reload_due(self._config, self.progress, loaded_at) and run.loaders.reloadable:
                    self._reload_loaders(run)
                    loaded_at, epoch_iter = self.current_epoch, None
                self._train_epoch(run, epoch_iter)
                epoch_iter = None  # the next epoch's is made when (and if) it starts
            self._metric_log.finish_windows()  # the last epoch's means, before the end of training
            _status.training_ended()  # the bar closed before on_train_end's summaries print
            run.state = run.pieces.end_training(
                run.state, self.current_epoch, module.step_spec(), self.step_options.precision,
                lambda: _pieces.statistics_batches(run.feed.loader, self.current_epoch, self.limits["train"]))
            self._sync_module(module, run.state)
            self._hooks.call("on_train_end", self, module)
        else:
            self._sync_module(module, run.state)
        self._hooks.call("on_fit_end", self, module)

    def _epoch_options(self, epoch: int, module: LitModule) -> step_lib.StepOptions:
        """The step options of train epoch `epoch`: an accumulation schedule's count then; the
        step returns what `training_step` returned when a batch-end hook may read it."""
        return epoch_options(self.step_options, self._accumulation, epoch,
                             hook_outputs=self._hooks.reads_outputs("on_train_batch_end", module))

    def _run_loaders(self, loaders: FitLoaders) -> FitLoaders:
        """With runs, a `DataLoader(shuffle="per_run")` gives each run its own order."""
        return loaders if self._runs is None else dataclasses.replace(loaders, train=self._runs.train_loader(loaders.train))

    def _reload_loaders(self, run: FitRun) -> None:
        """The loaders asked for again from the hooks they came from (Lightning's
        `reload_dataloaders_every_n_epochs`), with the epoch's batch count and device feed."""
        run.loaders = self._run_loaders(run.loaders.reloaded(bool(self.overfit_batches)))
        run.feed = run.feed.replaced(run.loaders.train, run.state.params)
        self._progress.batches_in_epoch = run.feed.batches_in_epoch
        run.val_every = schedule.val_check_batches(self._config, self.num_training_batches, run.loaders.val)

    def _train_epoch(self, run: FitRun, epoch_iter) -> None:
        """One epoch: its start, its batches (`_epoch.train_batches`: the steps with their hooks,
        logs, validations and stop checks), then its end work, unless a stop ended it early."""
        module, feed = run.module, run.feed
        offset, run.resume_at = run.resume_at, 0  # > 0 for an epoch resumed mid-way
        if not offset:  # a resumed epoch's means start from the checkpoint's accumulators
            self._metric_log.start_epoch()
        self._progress.start_epoch(offset)
        options = self._epoch_options(self.current_epoch, module)
        if options != feed.options:  # an accumulation schedule's count for this epoch: its own steps
            run.compiled = feed.use_options(options, run.compiled, run.state.params)
        if not offset:  # a resumed epoch had its start (SWA's averaging) before the save
            run.state = run.pieces.epoch_start(run.state, self.current_epoch)
        self._hooks.call("on_train_epoch_start", self, module)
        _epoch.write_params(run)
        parts = _epoch.EpochParts(self, self._hooks, self._progress, self.progress, self._metric_log, self._config,
                                  self._stop_request, self.profiler.wrap_step, self.step_options.detect_anomaly,
                                  self._validate_during_fit)
        steps_left = None if self.max_steps is None else self.max_steps - self.global_step
        # a chunk is one batch unless accumulate_grad_batches or steps_per_execution group them;
        # held here until the epoch's work is done (a stop saves while they are paused)
        chunks = iter(self.profiler.wrap_batches(feed.chunks(
            self.current_epoch, epoch_iter, start=offset, steps_left=steps_left,
            current_step=lambda: run.state.step, shard_inputs=run.compiled.shard_inputs)))
        ended = _epoch.train_batches(parts, run, chunks, offset=offset)
        if ended == "signal":  # every process stops after the same step, saves there (`_preemption`)
            stop, run.requeue_from = _preemption.stopped(self, self._stop_request.signal)
            raise stop
        if ended == "pause":  # the epoch's end work is left to the fit that resumes it
            _status.training_ended()  # the bar closed above the stop's line
            _stop.pause_epoch(self._progress, self.checkpoint_callbacks, self, module,
                              is_global_zero=self.is_global_zero)
            return
        _epoch.end_epoch(parts, run)
        if schedule.max_steps_reached(self._config, self._progress) and not schedule.epoch_exhausted(self._progress):
            # the run's end inside an epoch: a save after it (the default checkpoint's at the end
            # of training) resumes at the next batch of this epoch, as one made before its end
            # work does, so a fit resumed with a larger max_steps trains the epoch's rest
            self._metric_log.finish_windows()  # its accumulators: the epoch's, all of them read
            self._cut_point = self._resume_point()
        self._progress.end_epoch()

    def _sync_module(self, module: LitModule, state: TrainState) -> None:
        """Hands the trained variables back to the module (and into an NNX model object)."""
        variables = trained_variables(state, self.step_options.pieces, runs=self._runs is not None)
        module_lib.set_variables(module, *variables)

    # ------------------------------------------------------------------ evaluation stages

    def validate(self, module: LitModule | None = None, data: Any = None, *, datamodule: DataModule | None = None,
                 ckpt_path: str | os.PathLike | None = None, verbose: bool = True,
                 model: LitModule | None = None, dataloaders: Any = None) -> list[HostMetrics]:
        """Evaluates `module` on `data`; returns `[{"val/loss": ..., "val/<metric>": ...}]`, with
        what the module's hooks logged during the validation (`on_validation_epoch_end`).

        `data` may be several loaders (a list, tuple or dict of them): Lightning's result, one
        dict per loader, each with its own `<key>/dataloader_idx_<i>` values and the values
        logged outside the steps. `ckpt_path` ("last", "best" or a checkpoint folder) evaluates
        those weights instead.
        `verbose=False`: the progress bar prints no results line (Lightning's `verbose`).
        Lightning's spellings work too (`model=`, `dataloaders=`, a datamodule as `data`, the
        module's own `val_dataloader()`); without a module, the last fit's from its best
        checkpoint.
        """
        return self._run_eval_stage(module, data, datamodule, ckpt_path, verbose, stage="val",
                                    model=model, dataloaders=dataloaders)

    def test(self, module: LitModule | None = None, data: Any = None, *, datamodule: DataModule | None = None,
             ckpt_path: str | os.PathLike | None = None, verbose: bool = True,
             model: LitModule | None = None, dataloaders: Any = None) -> list[HostMetrics]:
        """Evaluates `module` on `data`; returns `[{"test/loss": ..., "test/<metric>": ...}]`
        (one dict per loader, as `validate`).

        `verbose=False`: the progress bar prints no results line (Lightning's `verbose`).
        Lightning's spellings work as in `validate` (`test_dataloader()` on the module).
        """
        return self._run_eval_stage(module, data, datamodule, ckpt_path, verbose, stage="test",
                                    model=model, dataloaders=dataloaders)

    @in_precision
    def _run_eval_stage(self, module, data, datamodule, ckpt_path, verbose, *, stage: str,
                        model=None, dataloaders=None) -> list[HostMetrics]:
        name = {"val": "validate", "test": "test"}[stage]
        module, data, datamodule, ckpt_path = _arguments.stage_arguments(self, name, module, model, data, dataloaders,
                                                                         datamodule, ckpt_path)
        self._lightning_module = module
        if not isinstance(verbose, bool):
            raise TypeError(f"Trainer.{name}(verbose=...) takes True or False, got {verbose!r}.")
        # Ctrl-C: Lightning's line, status 130; Lightning's eval mode for what the hooks run; a
        # status line per compilation, as in fit (its times not logged: no fit's window to join)
        with _interrupt.graceful(), module_lib.hook_mode(module, False), CompileTimes():
            loaders = evaluation.stage_loaders(module, data, datamodule, stage=stage, method=name)
            check_dataloader_idx(module, stage, several=len(loaders) > 1)
            ckpt_path = _resume.resolve_ckpt_path(self, ckpt_path, where=f"Trainer.{name}(ckpt_path=...)")
            with self._set_up(module, Stage(name, verbose=verbose)):
                variables = self._eval_variables(module, loaders[0], stage, ckpt_path)
                if stage == "val":
                    self.num_val_batches = evaluation.val_batch_counts(loaders, self.limits["val"])
                logged = evaluation.run_stage(self._eval_parts(), module, self._in_use, loaders, variables, stage=stage)
            for logger in self.loggers:
                logger.save()
            return logged

    @contextlib.contextmanager
    def _set_up(self, module: LitModule, stage: Stage) -> Iterator[None]:
        """`stage` for the hooks (`trainer.stage`) between its `setup` and `teardown` hooks."""
        before, self._stage = self._stage, stage
        _compile_cache.use(self._compile_cache)  # before the stage's first compilation
        self._hooks.call("setup", self, module, stage.name)
        try:
            yield
        finally:
            self._hooks.call("teardown", self, module, stage.name)
            self._stage = before

    def _eval_parts(self) -> evaluation.EvalParts:
        return evaluation.EvalParts(self, self._hooks, self._metric_log, self.strategy, self.limits)

    @in_precision
    def predict(self, module: LitModule | None = None, data: Any = None, *, datamodule: DataModule | None = None,
                ckpt_path: str | os.PathLike | None = None, model: LitModule | None = None,
                dataloaders: Any = None, return_predictions: bool | None = None) -> Any:
        """Runs `module.predict_step` over `data`; returns host (numpy) outputs concatenated in
        input order, every example exactly once (the padding of a last partial batch removed).
        With several processes, every process returns all of them (gathered from the others).

        Lightning's spellings work as in `validate` (`predict_dataloader()` on the module);
        `return_predictions=False` returns None."""
        module, data, datamodule, ckpt_path = _arguments.stage_arguments(self, "predict", module, model, data,
                                                                         dataloaders, datamodule, ckpt_path)
        self._lightning_module = module
        # Ctrl-C as in fit; eval mode; a status line per compilation
        with _interrupt.graceful(), module_lib.hook_mode(module, False), CompileTimes():
            loader = evaluation.stage_loaders(module, data, datamodule, stage="predict", method="predict",
                                              several=False)[0]
            ckpt_path = _resume.resolve_ckpt_path(self, ckpt_path, where="Trainer.predict(ckpt_path=...)")
            with self._set_up(module, Stage("predict")):
                variables = self._eval_variables(module, loader, "predict", ckpt_path)
                host = evaluation.run_predict(self._eval_parts(), module, self._in_use, loader, variables,
                                              keep=return_predictions is not False)
        if not host or return_predictions is False:
            return None
        return jax.tree.map(lambda *xs: np.concatenate(xs, axis=0), *host)

    @in_precision
    def generate(self, module: LitModule, prompts: Any, *, max_new_tokens: int = 64, temperature: float = 1.0,
                 top_k: int | None = None, top_p: float | None = None, seed: int = 0,
                 eos_token_id: int | Sequence[int] | None = None, use_cache: bool | None = None) -> Any:
        """Continues each prompt by up to `max_new_tokens` tokens sampled from `module`'s model.

        Prompts are token ids (a list or 1-D array, a list of them, a 2-D array) or, when the
        module has a `tokenizer` (a Hugging Face tokenizer set in `__init__`:
        `self.tokenizer = AutoTokenizer.from_pretrained(folder)`), text. Returns each prompt's
        new tokens (a list of ids; text for text prompts, decoded without special tokens), up to
        and including its end-of-sequence token; one result for one prompt. The weights are the
        last fit's (its evaluation copy: `EMA(use_for_eval=True)`'s), else the module's own,
        else those `load_weights` names, placed as this trainer's strategy shards the model.

        Two compiled programs per prompt-length bucket (16, 24, 32, 48, 64, ... tokens) run the
        generation with the model's KV cache (`fitjax.loop.generation`), batched, each row
        stopping at its end-of-sequence token: the prompts' pass, then chunks of about a quarter
        of a second of tokens. `module.generate_step` is the traced forward pass.

        Ctrl-C stops it after the chunk in flight (within about a second) and raises
        `Interrupted` (status 130 if uncaught) whose `generated` holds the tokens made so far,
        in the form this returns (docs/guides/language_models.md); a second one raises at once.

        Args:
            module: the `LitModule` whose model generates.
            prompts: see above; prompts of different lengths are left-padded together.
            max_new_tokens: `fj.GenerationOptions.max_new_tokens` (each sampling option's meaning,
                default and allowed values are defined there once, for every place that generates).
            temperature: `fj.GenerationOptions.temperature` (0: greedy).
            top_k: `fj.GenerationOptions.top_k`.
            top_p: `fj.GenerationOptions.top_p`.
            seed: `fj.GenerationOptions.seed`.
            eos_token_id: the id (or ids) a row stops at; default the tokenizer's, else the
                model's `config.eos_token_id`; None with neither: rows run to `max_new_tokens`.
            use_cache: `fj.GenerationOptions.use_cache`.

        Example:
            >>> # trainer.generate(module, ["Once upon a time"], max_new_tokens=32, temperature=0.8, top_p=0.95)
            >>> # trainer.generate(module, [[50256, 464, 3290]], max_new_tokens=8, temperature=0)
        """
        checks.check_module(module, "generate")
        _compile_cache.use(self._compile_cache)
        model = module_lib.unwrap_host_model(getattr(module, "model", None))
        if eos_token_id is None:
            eos_token_id = _prompts.default_eos(getattr(module, "tokenizer", None), getattr(model, "config", None))
        options = GenerationOptions(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                                    seed=seed, eos_token_id=eos_token_id, use_cache=use_cache, where="Trainer.generate")
        with _interrupt.graceful(), module_lib.hook_mode(module, False), CompileTimes():
            state = self.state
            # parameters kept in host memory (`offload="optimizer+master"`) copied to the device for it
            held = (in_device_memory(self._eval_params()), state.model_state) \
                if state is not None and self._in_use.module is module else None
            variables = generation.variables_for(module, held, strategy=self.strategy, seed=self.seed,
                                                 options=self.step_options)
            return generation.generate(module, prompts, options, variables=variables, strategy=self.strategy,
                                       policy=self.step_options.precision)

    def _eval_variables(self, module: LitModule, loader, stage: str, ckpt_path=None) -> tuple:
        """Sharded `(params, model_state, rng)` for eval: the last fit's when it fitted `module`,
        else built from the stage's first batch (from `ckpt_path` when given)."""
        state = self.state
        if ckpt_path is None and state is not None and self._in_use.module is module:
            return self._eval_params(), state.model_state, state.rng
        with _status.phase("initialising the state", "initialised the state"):
            variables, self._built = evaluation.build_for(module, loader, stage, strategy=self.strategy,
                                                          seed=self.seed, options=self.step_options,
                                                          limit=self.limits[stage])
        return evaluation.with_weights(self, self._hooks, module, variables, stage, ckpt_path)

    def _sanity_check(self, run: FitRun) -> None:
        """Lightning's sanity check: `num_sanity_val_steps` validation batches (of each loader)
        before training, with the validation hooks (`trainer.sanity_checking` is True); nothing
        is logged."""
        module, val_loaders = run.module, run.loaders.val
        if not self.num_sanity_val_steps or not schedule.validation_enabled(self._config, val_loaders):
            return
        limit = self.limits["val"] if self.num_sanity_val_steps == -1 else self.num_sanity_val_steps
        before, self._stage = self._stage, dataclasses.replace(self._stage, sanity_checking=True)
        try:
            with module_lib.hook_mode(module, False):  # Lightning's eval mode
                self._hooks.call("on_sanity_check_start", self, module)
                self.num_val_batches = evaluation.val_batch_counts(val_loaders, limit)
                evaluation.run_validation(self._eval_parts(), run, self.step_options.pieces, limit=limit)
        finally:
            self._stage = before
        self._hooks.call("on_sanity_check_end", self, module)

    def _validate_during_fit(self, run: FitRun) -> None:
        """A validation inside fit (Lightning's eval mode during it, train mode after it)."""
        self._metric_log.finish_windows()  # callbacks of validation see every train value up to now
        self._metric_log.time_finished(run.state.step)  # it/s: the steps before it (it waits for them)
        with self.profiler.profile("[loop] validation"), module_lib.hook_mode(run.module, False):
            self.num_val_batches = evaluation.val_batch_counts(run.loaders.val, self.limits["val"])
            evaluation.run_validation(self._eval_parts(), run, self.step_options.pieces, limit=self.limits["val"],
                                      progress=self._progress)
        run.last_val_time = time.monotonic()  # a duration counts from here (Lightning's: after the hooks)
        self._metric_log.restart_speed()  # it/s leaves the validation out

    # ------------------------------------------------------------------------ checkpoints

    def save_checkpoint(self, filepath: str | os.PathLike, weights_only: bool = False) -> None:
        """Saves the train state and the loop's progress as the checkpoint folder `filepath`,
        now (waits until it is written). Every process calls it, as in Lightning.

        `Trainer.fit(ckpt_path=filepath)` resumes from it exactly, `LitModule.load_from_checkpoint`
        reads its weights. `weights_only=True` is refused: a fitjax checkpoint is the whole
        `TrainState`, and reading the weights alone is what `load_from_checkpoint` does.
        """
        built = self._in_use
        path = checks.save_target(filepath, weights_only, has_state=self.state is not None and built is not None)
        checkpoint.prepare(path.parent)
        writer = checkpoint.writer()  # the process's one writer, after the saves queued before
        self.record_save()
        writer.save(path, self.state, self.checkpoint_meta(built.module))
        writer.wait()  # written (and its failure raised) before returning

    def checkpoint_meta(self, module: LitModule) -> dict[str, Any]:
        """What a checkpoint taken now stores besides the train state, as plain (JSON) data: the
        loop's progress (with this position as the last saved), the data position, callback and
        logger states, hyperparameters. A read: it changes nothing (`record_save` acts)."""
        point = self._resume_point()
        if self._cut_point is not None and self._cut_point.global_step == point.global_step:
            point = self._cut_point  # no step since max_steps cut the epoch short
        # the `on_save_checkpoint` hooks see the host model from any save (a step's save from a
        # `plain_hook` runs outside the hooks' usual block); already installed: unchanged
        with module_lib.host_model_installed(module, lambda: self._host_variables(module)):
            meta = _resume.fit_meta(point, module, callbacks=self.callbacks, loggers=self.loggers,
                                    precision=self.precision, pieces=self.step_options.pieces,
                                    save_hooks=self._hooks.overriding("on_save_checkpoint"), trainer=self)
        if self._runs is not None:  # which run is which: `load_from_checkpoint(path, run=i)` reads it
            meta["runs"] = self._runs.to_meta()
        return meta

    def _resume_point(self) -> _resume.ResumePoint:
        """Where a fit resumed from a checkpoint taken now continues (`ResumePoint.at`)."""
        progress = self._progress
        stopped = self.should_stop or (self.max_steps is not None and progress.global_step >= self.max_steps)
        positions = (self._run.feed.positions if self._run is not None
                     else self._built.positions if self._built is not None else None)
        return _resume.ResumePoint.at(progress, stopped=stopped, epoch_acc=self._metric_log.epoch_accumulators,
                                      loader_state=positions.state_after if positions else lambda done: None)

    def record_save(self) -> None:
        """Readies the loop for a checkpoint of the current position, before `checkpoint_meta`:
        the train log window on its way is logged (its rows reach the loggers and the epoch's
        means, which the checkpoint holds), and the position becomes the last saved one
        (`trainer.progress.last_saved`). Whoever saves calls it, as `ModelCheckpoint` does."""
        self._metric_log.finish_windows()
        self._progress.last_saved = self._progress.position
