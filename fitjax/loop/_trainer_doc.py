"""The Args sections of the Trainer's reference, its constructor's, `plan`'s and `generate`'s:
each is put into its docstring when the class is made (`with_arguments`), so `help(...)`,
`fitjax fit --help` (jsonargparse) and the API page (`docs/hooks/imported_docs.py`) show them while
`trainer.py` keeps to the loop.
"""

from __future__ import annotations

import re
from typing import TypeVar

__all__ = ["ARGUMENTS", "with_arguments"]

T = TypeVar("T")

_NEXT_SECTION = re.compile(r"\n(?=[ ]*(?:Returns|Example):\n)")  # the section the Args section goes before


def with_arguments(obj: T) -> T:
    """`obj` (the `Trainer` or one of its methods) with its Args section, `ARGUMENTS[qualified
    name]`, in its docstring before its Returns or Example section."""
    head, rest = _NEXT_SECTION.split(obj.__doc__, maxsplit=1)
    obj.__doc__ = f"{head}\n{ARGUMENTS[obj.__qualname__]}\n{rest}"
    return obj


ARGUMENTS = {
    "Trainer": """\
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
            device memory between steps (`fitjax.step.offload`; `fitjax plan` counts them as host
            memory). Raises where the devices have no host memory kind.
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
""",
    "Trainer.plan": """\
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
                "strategy", "accumulate", "precision", "remat").
            memory_bytes: memory per device to fit in (default: the device's, or the device
                kind's from the table; none on CPU).
            headroom: the fraction of the memory kept free (fragmentation, the runtime).
            strategy: plan this strategy instead of the trainer's, its mesh built over the
                target's devices, not this machine's: "auto" is "dp" over a slice's chips, and
                `FSDP(fsdp=4, tensor=2)` plans for "tpu-v5e-8" from a laptop with one device
                (`fj.plan` and `fitjax plan` pass a target's strategy this way).
""",
    "Trainer.generate": """\
        Args:
            module: the `LitModule` whose model generates.
            prompts: see above; prompts of different lengths are left-padded together.
            max_new_tokens: tokens generated per prompt at most; with the longest prompt within
                the model's `max_positions` (if it has one) and int32's positions.
            temperature: 0 picks the most likely token (greedy); otherwise the logits are
                divided by it and a token drawn.
            top_k: draw among the k most likely tokens only (None: all).
            top_p: draw among the most likely tokens holding this probability mass (None: all).
            seed: the draws' random key: the same seed, prompts and weights give the same tokens.
            eos_token_id: the id (or ids) a row stops at; default the tokenizer's, else the
                model's `config.eos_token_id`; None with neither: rows run to `max_new_tokens`.
            use_cache: None: a KV cache when the model has `init_cache`; False: re-run the whole
                sequence for each token (slower, the same tokens).
""",
}
