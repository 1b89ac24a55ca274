"""`MLFlowLogger`: params, metrics at their steps, tags and (on request) checkpoints in MLflow."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any


from fitjax.loggers._base import Logger, check_status
from fitjax.loggers._hparams import check_params, flatten
from fitjax.loggers._model_uploads import ModelUploads, check_log_model, require

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

__all__ = ["MLFlowLogger"]

# MLflow's limits per request and per value (mlflow/utils/validation.py).
_MAX_METRICS_PER_BATCH = 1000
_MAX_PARAMS_PER_BATCH = 100
_MAX_PARAM_LENGTH = 6000
# Characters MLflow accepts in a key; others are dropped, as Lightning's MLFlowLogger does.
_BAD_KEY_CHARS = re.compile(r"[^a-zA-Z0-9_\-. /:]+")
_RUN_STATUS = {"success": "FINISHED", "failed": "FAILED", "interrupted": "KILLED"}


class MLFlowLogger(Logger):
    """Logs to an MLflow tracking store: a local database file by default, or any tracking URI.

    Hyperparameters become the run's params (nested keys joined with "/", values as strings),
    metrics are logged at their global step, `tags` are set when the run is created. With
    `log_model`, checkpoints saved by `ModelCheckpoint` are uploaded as artifacts under
    `checkpoints/<name>/`: True uploads those kept when fit ends, "all" each one as it is saved.
    Nothing is created before the first write, and nothing at all on processes other than 0.

    With no `tracking_uri` (and no `MLFLOW_TRACKING_URI` in the environment) runs go to
    `sqlite:///<save_dir>/mlflow.db` and artifacts to `<save_dir>/artifacts/`: no server, no
    network; `mlflow ui --backend-store-uri sqlite:///mlruns/mlflow.db` shows them. MLflow's file
    store (`tracking_uri="file:./mlruns"`) also works once `MLFLOW_ALLOW_FILE_STORE=true` is set.

    Args:
        experiment_name: The experiment the run belongs to; created when missing.
        run_name: The run's display name (MLflow picks one when None).
        tracking_uri: Where runs are stored (`sqlite:///...`, `file:...`, `http://...`).
        tags: Tags set on the run when it is created.
        save_dir: The local folder of the default store.
        log_model: False, True or "all" (see above).
        prefix: Put before every metric key as `<prefix>-<key>`.
        artifact_location: Where a newly created experiment stores artifacts.
        run_id: Continue this existing run instead of creating one.
        process_index: This process's index; defaults to `jax.process_index()`. Only 0 logs.

    Example:
        >>> logger = MLFlowLogger(experiment_name="digits", save_dir="mlruns")   # doctest: +SKIP
        >>> trainer = fj.Trainer(logger=logger)                                  # doctest: +SKIP
    """

    def __init__(
        self,
        experiment_name: str = "fitjax_logs",
        run_name: str | None = None,
        tracking_uri: str | None = None,
        tags: Mapping[str, Any] | None = None,
        save_dir: str | os.PathLike[str] = "./mlruns",
        log_model: bool | str = False,
        prefix: str = "",
        artifact_location: str | None = None,
        run_id: str | None = None,
        *,
        process_index: int | None = None,
    ) -> None:
        require("MLFlowLogger", "mlflow", "mlflow")
        if not isinstance(experiment_name, str) or not experiment_name:
            raise ValueError(f"`MLFlowLogger(experiment_name=...)` must be a non-empty str; got {experiment_name!r}.")
        if tags is not None and not isinstance(tags, Mapping):
            raise TypeError(f"`MLFlowLogger(tags=...)` must be a mapping of tag names to values; got {tags!r}.")
        self._experiment_name = experiment_name
        self._run_name = run_name
        self._save_dir = Path(save_dir)
        self._default_store = tracking_uri is None and not os.environ.get("MLFLOW_TRACKING_URI")
        self._tracking_uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or (
            f"sqlite:///{self._save_dir.absolute() / 'mlflow.db'}")
        self._tags = {str(k): str(v) for k, v in (tags or {}).items()}
        self._uploads = ModelUploads(check_log_model("MLFlowLogger", log_model))
        self._prefix = prefix
        self._artifact_location = artifact_location
        self._run_id = run_id
        self._experiment_id: str | None = None
        self._process_index = process_index
        self._client: MlflowClient | None = None

    # ------------------------------------------------------------------------- identity

    @property
    def experiment(self) -> MlflowClient:
        """The `mlflow.tracking.MlflowClient`, with the run created: for anything not logged here."""
        self._ensure_run()
        assert self._client is not None
        return self._client

    @property
    def run_id(self) -> str | None:
        """The run's id (created on first access on process 0; None on the others)."""
        return self._ensure_run() if self._is_writer() else None

    @property
    def experiment_id(self) -> str | None:
        """The experiment's id (as `run_id`)."""
        if self._is_writer():
            self._ensure_run()
        return self._experiment_id

    @property
    def name(self) -> str:
        """The experiment id, as Lightning's MLFlowLogger (the experiment name before any write)."""
        return self._experiment_id or self._experiment_name

    @property
    def version(self) -> str:
        """The run id ("" before the run exists)."""
        return self._run_id or ""

    @property
    def save_dir(self) -> Path | None:
        """The local folder of the default store, None for any other tracking URI."""
        return self._save_dir if self._default_store else None

    # -------------------------------------------------------------------------- logging

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        """Logs `params` as the run's params: flattened with "/", each value as a string."""
        check_params("MLFlowLogger", params)
        if not self._is_writer():
            return
        from mlflow.entities import Param

        items = [Param(k, str(v)[:_MAX_PARAM_LENGTH]) for k, v in flatten(params).items()]
        run_id = self._ensure_run()
        for i in range(0, len(items), _MAX_PARAMS_PER_BATCH):
            self._client.log_batch(run_id, params=items[i:i + _MAX_PARAMS_PER_BATCH], synchronous=True)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Logs one point per key at `step`, in as few requests as MLflow allows."""
        if not self._is_writer() or not metrics:
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        prefix = f"{self._prefix}-" if self._prefix else ""
        items = [Metric(_BAD_KEY_CHARS.sub("", f"{prefix}{k}"), float(v), now, int(step))
                 for k, v in metrics.items()]
        run_id = self._ensure_run()
        for i in range(0, len(items), _MAX_METRICS_PER_BATCH):
            self._client.log_batch(run_id, metrics=items[i:i + _MAX_METRICS_PER_BATCH], synchronous=True)

    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        """With `log_model="all"`, uploads each checkpoint once it is complete on disk."""
        if self._is_writer():
            self._upload(self._uploads.saved(checkpoint_callback))

    def finalize(self, status: str) -> None:
        """Uploads the remaining checkpoints (`log_model`) and ends the run with `status`.

        Safe to call twice; logging afterwards reopens nothing and goes to the same run.
        """
        check_status("MLFlowLogger", status)
        if not self._is_writer() or self._client is None:
            return
        self._upload(self._uploads.pending())
        self._client.set_terminated(self._run_id, _RUN_STATUS[status])

    def state_dict(self) -> dict[str, Any]:
        """`{"run_id": ...}`: a run resumed from a checkpoint keeps logging to the same MLflow run."""
        return {"run_id": self._run_id}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continues the saved run, unless a `run_id` was given or the run already started."""
        if self._run_id is None and self._client is None and state.get("run_id"):
            self._run_id = str(state["run_id"])

    # -------------------------------------------------------------------------- helpers

    def _ensure_run(self) -> str:
        if self._client is not None:
            return self._run_id  # type: ignore[return-value]
        from mlflow.tracking import MlflowClient

        if self._default_store:
            self._save_dir.mkdir(parents=True, exist_ok=True)
        client = MlflowClient(tracking_uri=self._tracking_uri)
        if self._run_id is not None:
            run = client.get_run(self._run_id)
            self._experiment_id = run.info.experiment_id
            if run.info.status != "RUNNING":
                client.update_run(self._run_id, status="RUNNING")
        else:
            experiment = client.get_experiment_by_name(self._experiment_name)
            if experiment is None:
                location = self._artifact_location
                if location is None and self._default_store:
                    location = (self._save_dir.absolute() / "artifacts").as_uri()
                self._experiment_id = client.create_experiment(self._experiment_name, artifact_location=location)
            else:
                self._experiment_id = experiment.experiment_id
            run = client.create_run(self._experiment_id, run_name=self._run_name, tags=self._tags)
            self._run_id = run.info.run_id
        self._client = client
        return self._run_id

    def _upload(self, folders: list[Path]) -> None:
        for folder in folders:
            self._client.log_artifacts(self._ensure_run(), str(folder), artifact_path=f"checkpoints/{folder.name}")
