"""Ray Train: a fitjax `fit` on every worker of a Ray worker group, checkpoints reported to Ray.

`RayTrainer(train_fn, num_workers=...)` runs `train_fn(config)` on each worker through Ray Train's
`JaxTrainer`. Before it runs, rank 0 picks the coordinator (its address, a free port) and every
worker gets it with Ray's ranks as `FITJAX_RAY_*` variables: `Trainer()` then detects a
`RayEnvironment` and starts `jax.distributed` with them (on CPUs Ray does not start it itself).
`RayReport()` saves a checkpoint at each epoch end and hands it to `ray.train.report`; after a
failure Ray restarts the whole group (`max_failures`), and `checkpoint_path()` is the last reported
checkpoint for `fit(ckpt_path=...)`, so the restarted group resumes where it was.

Example (`pip install "ray[train]"`):
    >>> import fitjax as fj
    >>> from fitjax.integrations.ray import RayReport, RayTrainer, checkpoint_path
    >>> def train(config):
    ...     trainer = fj.Trainer(max_epochs=config["epochs"], callbacks=[RayReport()])
    ...     trainer.fit(MyModule(), my_loader(), ckpt_path=checkpoint_path())
    >>> # result = RayTrainer(train, num_workers=4, config={"epochs": 10}, max_failures=2).fit()
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Any, Callable

import ray
import ray.train
from ray.train import Checkpoint, FailureConfig, RunConfig, ScalingConfig
from ray.train.collective import broadcast_from_rank_zero
from ray.train.v2.jax import JaxTrainer

from fitjax.callbacks import Callback

__all__ = ["RayReport", "RayTrainer", "checkpoint_path", "setup_worker"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def setup_worker() -> None:
    """On each worker, before the first `Trainer`: Ray's ranks and rank 0's coordinator as the
    `FITJAX_RAY_*` variables `RayEnvironment` reads (one broadcast from rank 0)."""
    context = ray.train.get_context()
    address = None
    if context.get_world_rank() == 0:
        address = f"{ray.util.get_node_ip_address()}:{_free_port()}"
    address = broadcast_from_rank_zero(address)
    os.environ.update(
        FITJAX_RAY_COORDINATOR=address, FITJAX_RAY_WORLD_SIZE=str(context.get_world_size()),
        FITJAX_RAY_WORLD_RANK=str(context.get_world_rank()), FITJAX_RAY_LOCAL_RANK=str(context.get_local_rank()),
        FITJAX_RAY_LOCAL_WORLD_SIZE=str(context.get_local_world_size()),
        FITJAX_RAY_NODE_RANK=str(context.get_node_rank()))


def checkpoint_path() -> str | None:
    """The last checkpoint this run reported to Ray, as a local folder (None on a first start):
    what a restarted worker group passes to `fit(ckpt_path=...)`."""
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None:
        return None
    local = Path(tempfile.mkdtemp(prefix="fitjax-ray-restore-"))
    return checkpoint.to_directory(str(local))  # a copy per worker: any storage, local or remote


class RayReport(Callback):
    """Saves a checkpoint every `every_n_epochs` epoch ends and reports it with the epoch's metrics
    (`ray.train.report`); Ray keeps it in the run's storage.

    Every process saves collectively into the same local folder (on one machine, or a shared
    filesystem across machines), rank 0 reports the folder, which Ray copies, and removes it.

    Example:
        >>> from fitjax.integrations.ray import RayReport
        >>> callback = RayReport(every_n_epochs=2)
    """

    def __init__(self, every_n_epochs: int = 1):
        if isinstance(every_n_epochs, bool) or not isinstance(every_n_epochs, int) or every_n_epochs < 1:
            raise ValueError(f"RayReport(every_n_epochs=...) must be a positive int, got {every_n_epochs!r}")
        self.every_n_epochs = every_n_epochs

    def on_train_epoch_end(self, trainer, module) -> None:
        if (trainer.current_epoch + 1) % self.every_n_epochs:
            return
        context = ray.train.get_context()
        folder = (Path(tempfile.gettempdir()) / "fitjax-ray" / context.get_experiment_name()
                  / f"epoch={trainer.current_epoch}-step={trainer.global_step}")
        trainer.save_checkpoint(folder)  # every process; written when it returns
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}  # host values: a sync
        metrics.update(epoch=trainer.current_epoch, step=trainer.global_step)
        chief = context.get_world_rank() == 0
        ray.train.report(metrics, checkpoint=Checkpoint.from_directory(str(folder)) if chief else None)
        if chief:  # Ray has its copy (uploads are synchronous by default)
            shutil.rmtree(folder, ignore_errors=True)


class RayTrainer:
    """Runs `train_fn(config)` on `num_workers` Ray Train workers as one fitjax run.

    Args:
        train_fn: the per-worker function; it builds a `fj.Trainer` (which finds the
            `RayEnvironment`) and fits, usually with `RayReport()` and `ckpt_path=checkpoint_path()`.
        num_workers: processes (Ray workers).
        config: passed to `train_fn`.
        resources_per_worker: Ray resources of each worker (default one CPU).
        use_gpu: each worker asks Ray for GPUs (`resources_per_worker={"GPU": n}`).
        max_failures: how many times Ray restarts the worker group after a failure.
        storage_path / name: where Ray keeps the reported checkpoints (a local folder or a URL).
        worker_env: environment variables of the workers (e.g. `XLA_FLAGS`, `JAX_PLATFORMS`).

    Example:
        >>> from fitjax.integrations.ray import RayTrainer
        >>> runner = RayTrainer(print, num_workers=2, max_failures=1)   # train_fn, workers, restarts
    """

    def __init__(self, train_fn: Callable[[dict], Any], *, num_workers: int, config: dict | None = None,
                 resources_per_worker: dict | None = None, use_gpu: bool = False, max_failures: int = 0,
                 storage_path: str | os.PathLike | None = None, name: str | None = None,
                 worker_env: dict[str, str] | None = None):
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"RayTrainer(num_workers=...) must be a positive int, got {num_workers!r}")
        if isinstance(max_failures, bool) or not isinstance(max_failures, int) or max_failures < -1:
            raise ValueError(f"RayTrainer(max_failures=...) must be an int >= 0 (or -1: without limit), "
                             f"got {max_failures!r}")
        self.train_fn = train_fn
        self.config = dict(config or {})
        self.scaling = ScalingConfig(num_workers=num_workers, use_gpu=use_gpu,
                                     resources_per_worker=resources_per_worker or {"CPU": 1})
        self.run_config = RunConfig(
            name=name, storage_path=None if storage_path is None else os.fspath(storage_path),
            failure_config=FailureConfig(max_failures=max_failures),
            worker_runtime_env={"env_vars": dict(worker_env or {})})

    def fit(self) -> ray.train.Result:
        """Runs the worker group until `train_fn` returns on every worker; Ray's `Result`
        (`.metrics`: the last report, `.checkpoint`: the last reported checkpoint)."""
        train_fn = self.train_fn

        def per_worker(config: dict) -> None:
            setup_worker()
            train_fn(config)

        trainer = JaxTrainer(per_worker, train_loop_config=self.config, scaling_config=self.scaling,
                             run_config=self.run_config)
        return trainer.fit()
