"""`WandbLogger`: config, metrics at their steps and (on request) checkpoints in Weights & Biases."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any


from fitjax.loggers._base import Logger, check_status
from fitjax.loggers._hparams import check_params, to_plain
from fitjax.loggers._model_uploads import ModelUploads, check_log_model, require

if TYPE_CHECKING:
    from wandb.sdk.wandb_run import Run

__all__ = ["WandbLogger"]

# The x-axis every metric is drawn against: the trainer's global step, not W&B's own row counter
# (rows are logged at log steps only, and validation rows can share a step with training ones).
_STEP_KEY = "trainer/global_step"


class WandbLogger(Logger):
    """Logs to Weights & Biases, online or offline (no network, no account: `offline=True`).

    Arguments follow Lightning's `WandbLogger`. Hyperparameters go to the run's config, metrics
    are logged with `trainer/global_step` as their x-axis, and with `log_model` checkpoints saved
    by `ModelCheckpoint` become `model` artifacts (aliases "latest", and "best" for the callback's
    best): True uploads those kept when fit ends, "all" each one as it is saved. The run starts
    at the first write, on process 0 only, and ends when fit ends. Offline runs land in
    `<save_dir>/wandb/offline-run-*`; `wandb sync <that folder>` uploads them later.

    Args:
        name: The run's display name.
        save_dir: The folder W&B writes its run files under (`<save_dir>/wandb/`).
        version: The run id, to continue a run (alias of `id`).
        offline: Write locally only; no network access.
        dir: Same as `save_dir` (W&B's own name).
        id: Same as `version`.
        anonymous: Log to an anonymous account when not logged in.
        project: The W&B project (default "fitjax_logs").
        log_model: False, True or "all" (see above).
        experiment: An existing `wandb` run to log to instead of starting one.
        prefix: Put before every metric key as `<prefix>-<key>`.
        checkpoint_name: The model artifact's name (default `model-<run id>`).
        process_index: This process's index; defaults to `jax.process_index()`. Only 0 logs.
        **kwargs: Passed on to `wandb.init` (`entity`, `group`, `tags`, `notes`, ...).

    Example:
        >>> logger = WandbLogger(project="digits", offline=True, save_dir="runs")   # doctest: +SKIP
        >>> trainer = fj.Trainer(logger=logger)                                     # doctest: +SKIP
    """

    def __init__(
        self,
        name: str | None = None,
        save_dir: str | os.PathLike[str] = ".",
        version: str | None = None,
        offline: bool = False,
        dir: str | os.PathLike[str] | None = None,  # noqa: A002 - Lightning's and W&B's name
        id: str | None = None,  # noqa: A002
        anonymous: bool | None = None,
        project: str | None = None,
        log_model: bool | str = False,
        experiment: Run | None = None,
        prefix: str = "",
        checkpoint_name: str | None = None,
        *,
        process_index: int | None = None,
        **kwargs: Any,
    ) -> None:
        require("WandbLogger", "wandb", "wandb")
        self._save_dir = Path(dir if dir is not None else save_dir)
        self._id = version or id
        self._init_args = {
            "name": name,
            "project": project or "fitjax_logs",
            "dir": str(self._save_dir),
            "resume": "allow",
            "mode": "offline" if offline else kwargs.pop("mode", None),
            **({"anonymous": "allow"} if anonymous else {}),
            **kwargs,
        }
        self._uploads = ModelUploads(check_log_model("WandbLogger", log_model))
        self._prefix = prefix
        self._checkpoint_name = checkpoint_name
        self._experiment = experiment
        self._process_index = process_index

    # ------------------------------------------------------------------------- identity

    @property
    def experiment(self) -> Run:
        """The `wandb` run (started on first access), for anything not logged here."""
        if self._experiment is None:
            import wandb

            os.makedirs(self._save_dir, exist_ok=True)
            self._experiment = wandb.init(id=self._id, **self._init_args)
            self._experiment.define_metric(_STEP_KEY)
            self._experiment.define_metric("*", step_metric=_STEP_KEY, step_sync=True)
            self._id = self._experiment.id
        return self._experiment

    @property
    def name(self) -> str:
        """The project."""
        return self._experiment.project if self._experiment is not None else self._init_args["project"]

    @property
    def version(self) -> str:
        """The run id ("" before the run starts, unless given)."""
        return self._id or ""

    @property
    def save_dir(self) -> Path:
        """The folder W&B writes its run files under."""
        return self._save_dir

    # -------------------------------------------------------------------------- logging

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        """Puts `params` (nested mappings kept) into the run's config."""
        check_params("WandbLogger", params)
        if self._is_writer():
            self.experiment.config.update(to_plain(params), allow_val_change=True)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Logs one row: every key at `step` on the `trainer/global_step` axis."""
        if not self._is_writer() or not metrics:
            return
        prefix = f"{self._prefix}-" if self._prefix else ""
        row = {f"{prefix}{k}": float(v) for k, v in metrics.items()}
        self.experiment.log({**row, _STEP_KEY: int(step)})

    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        """With `log_model="all"`, uploads each checkpoint once it is complete on disk."""
        if self._is_writer():
            self._upload(self._uploads.saved(checkpoint_callback))

    def finalize(self, status: str) -> None:
        """Uploads the remaining checkpoints (`log_model`) and finishes the run.

        A failed or interrupted fit finishes it with exit code 1. Safe to call twice; logging
        afterwards continues the same run id.
        """
        check_status("WandbLogger", status)
        if not self._is_writer() or self._experiment is None:
            return
        self._upload(self._uploads.pending())
        experiment, self._experiment = self._experiment, None
        experiment.finish(exit_code=0 if status == "success" else 1)

    def state_dict(self) -> dict[str, Any]:
        """`{"id": ...}`: a run resumed from a checkpoint keeps logging to the same W&B run."""
        return {"id": self._id}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continues the saved run id, unless an id was given or the run already started."""
        if self._id is None and self._experiment is None and state.get("id"):
            self._id = str(state["id"])

    # -------------------------------------------------------------------------- helpers

    def _upload(self, folders: list[Path]) -> None:
        if not folders:
            return
        import wandb

        run = self.experiment
        best = self._uploads.best_paths()
        for folder in folders:
            artifact = wandb.Artifact(self._checkpoint_name or f"model-{run.id}", type="model",
                                      metadata={"path": str(folder)})
            artifact.add_dir(str(folder))
            aliases = ["latest", *(["best"] if folder in best else [])]
            run.log_artifact(artifact, aliases=aliases)
