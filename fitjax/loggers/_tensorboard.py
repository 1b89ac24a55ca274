"""`TensorBoardLogger`: scalars and the HPARAMS tab, one event-file folder per run."""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from fitjax._lazy import import_without
from fitjax.loggers import _event_file
from fitjax.loggers._base import check_status
from fitjax.loggers._hparams import Scalar, check_params, flatten, write_yaml
from fitjax.loggers._versioned import VersionedLogger

if TYPE_CHECKING:
    from tensorboardX import SummaryWriter
    from tensorboardX.proto.summary_pb2 import Summary

# tensorboardX is imported at the first write, not by `import fitjax`, and without torch: it imports
# torch (~3 s) only to annotate argument types, and fitjax hands it protobufs, never tensors.

# The tags and plugin name TensorBoard's hparams plugin reads (tensorboard/plugins/hparams/metadata.py).
_PLUGIN = "hparams"
_SESSION_START_TAG = "_hparams_/session_start_info"
_SESSION_END_TAG = "_hparams_/session_end_info"
_EXPERIMENT_TAG = "_hparams_/experiment"
# HParamInfo.differs (field 7 of TensorBoard's api.proto; tensorboardX's copy predates it): TensorBoard
# sorts the hyperparameters that differ first and ticks the first five of them.
_DIFFERS_TRUE = b"\x38\x01"
# Logged as scalars, not offered as the run's result columns in the HPARAMS table.
_NOT_RESULTS = ("epoch",)
# Compile seconds (`compile/<program>_s`) go to the Text tab as a table under one tag, not to one
# scalar card each: a card per program, one point each, stood above the train/val curves, and the
# programs JAX compiles differ from run to run (an eager `cos` in one, not in the next).
_COMPILE = "compile/"
_COMPILE_TAG = "compile_seconds/text_summary"  # tensorboardX's `add_text` naming
# tensorboardX names event files by the second and opens them with "wb": a second writer in the same
# folder within the same second would erase the first file. A per-process counter keeps names
# distinct and, zero-padded, in the order TensorBoard must read them.
_WRITER_COUNT = itertools.count()


class TensorBoardLogger(VersionedLogger):
    """Logs scalars and hyperparameters to TensorBoard event files in `<save_dir>/<name>/version_<N>`.

    Every metric key becomes a scalar chart at its global step (TensorBoard groups `train/…` and
    `val/…` by prefix), except the compile seconds fitjax logs (`compile/<program>_s`): each
    step's compilations are one table in the Text tab (tag `compile_seconds`), so the scalars
    hold the same cards run after run. Hyperparameters go to `hparams.yaml` and to the HPARAMS tab as a session
    of this same run folder (not a sub-run), so the tab's table shows each run's hyperparameters
    beside the last value of each of its metrics. Nothing is created until the first write, and
    nothing at all on processes other than 0.

    The HPARAMS table ticks the first five hyperparameters and the first five metrics it is given,
    so when the run ends an "experiment" summary orders them: the user's hyperparameters first
    (a module's `save_hyperparameters`, the CLI's `model/...` and `data/...` arguments; the CLI's
    `trainer/...` arguments and chosen class paths after them), then the results: `val/...`,
    the train epoch means, the other train values, `test/...`; `epoch` stays a scalar, not a
    result column. TensorBoard takes the first experiment summary it finds as the
    columns of every run in its log dir (as with Lightning's logger): runs of one script share
    them; a column that only a later run has shows in that run's `hparams.yaml` and scalars.
    TensorBoard keeps the first end status of a run folder, so only a successful end is written:
    a failed or interrupted run shows "Unknown" and can still end as "Success" when it is resumed
    into the same folder.

    Args:
        save_dir: Root folder of all experiments.
        name: Experiment folder under `save_dir` ("" for none).
        version: None for the next unused `version_<N>`, an int for `version_<int>`, or a folder name.
        flush_secs: How often, in seconds, buffered events reach the disk.
        process_index: This process's index; defaults to `jax.process_index()`. Only 0 writes.

    Example:
        >>> logger = TensorBoardLogger("runs")
        >>> logger.log_hyperparams({"lr": 1e-3, "model": {"width": 64}})
        >>> logger.log_metrics({"train/loss": 0.7, "lr": 1e-3}, step=50)
        >>> logger.finalize("success")
        >>> logger.log_dir.as_posix()
        'runs/fitjax_logs/version_0'
    """

    def __init__(
        self,
        save_dir: str | os.PathLike[str],
        name: str = "fitjax_logs",
        version: int | str | None = None,
        *,
        flush_secs: float = 10,
        process_index: int | None = None,
    ) -> None:
        super().__init__(save_dir, name, version, process_index=process_index)
        if isinstance(flush_secs, bool) or not isinstance(flush_secs, (int, float)) or not flush_secs > 0:
            raise ValueError(
                f"`TensorBoardLogger(flush_secs=...)` must be a number > 0 (seconds); got {flush_secs!r}."
            )
        self._flush_secs = flush_secs
        self._writer: SummaryWriter | None = None
        self._session_open = False  # a session start is in the file and its end is not
        self._hparams: dict[str, Scalar] = {}  # the session's hyperparameters, flattened
        self._tags: dict[str, None] = {}  # every metric key logged, in first-logged order

    @property
    def experiment(self) -> Any:
        """The tensorboardX `SummaryWriter` of this run (Lightning's `logger.experiment`), for
        what the logger has no method for: `add_image`, `add_histogram`, `add_figure`, ...
        On processes that do not write (all but process 0) a stand-in whose methods do nothing."""
        if not self._is_writer():
            return _NoWriter()
        return self._get_writer()

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Writes one scalar point per key at `step`, all in one event."""
        if not self._is_writer() or not metrics:
            return
        compiled = {k: v for k, v in metrics.items() if k.startswith(_COMPILE)}
        scalars = {k: v for k, v in metrics.items() if k not in compiled}
        writer = self._get_writer()
        if scalars:
            writer.file_writer.add_summary(_scalars(scalars), global_step=int(step))
            self._tags.update(dict.fromkeys(scalars))
        if compiled:
            writer.file_writer.add_summary(_text(_COMPILE_TAG, _compile_table(compiled)), global_step=int(step))
        self._note_step(int(step))

    def log_pictures(self, pictures: Mapping[str, Any], step: int) -> None:
        """Draws each matrix as an image (a confusion matrix: one square per cell, darker the
        larger its share of the row, so each true class reads across) in TensorBoard's Images tab."""
        if not self._is_writer() or not pictures:
            return
        writer = self._get_writer()
        for key, matrix in pictures.items():
            writer.add_image(key, _heatmap(matrix), global_step=int(step), dataformats="HWC")
        self._note_step(int(step))

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        """Starts the HPARAMS session of this run and writes `hparams.yaml`.

        Nested keys are joined with "/"; values other than bools, numbers and strings are shown as
        their `str`. TensorBoard keeps the first session start of a run, so call it once per run.
        """
        if not self._is_writer():
            return
        check_params("TensorBoardLogger", params)
        writer = self._get_writer()
        write_yaml(self._open() / "hparams.yaml", params)
        flat = flatten(params)
        self._hparams = self._hparams or flat  # the session's: TensorBoard keeps the first start
        writer.file_writer.add_summary(_session_start(flat))
        self._session_open = True

    def save(self) -> None:
        """Flushes buffered events to disk."""
        if self._writer is not None:
            self._writer.flush()
        self._upload()  # a store's copy, when save_dir is a URL

    def finalize(self, status: str) -> None:
        """Ends the HPARAMS session when `status` is "success", flushes and closes the event file.

        Safe to call twice, and after an exception; logging afterwards opens a new event file in
        the same folder.
        """
        check_status("TensorBoardLogger", status)
        if self._writer is None:
            if self._mirror is not None:  # hparams.yaml alone, or a second finalize
                self._upload()
                self._release_mirror()
            return
        writer, self._writer = self._writer, None
        try:
            if self._hparams:  # the table's columns, once the run's metrics are known
                writer.file_writer.add_summary(_experiment(self._hparams, list(self._tags)))
            if self._session_open and status == "success":
                self._session_open = False
                writer.file_writer.add_summary(_session_end())
        finally:
            writer.close()
            self._upload()
            self._release_mirror()  # a store's local copy, uploaded above

    def _get_writer(self) -> SummaryWriter:
        if self._writer is None:
            SummaryWriter = import_without("tensorboardX", blocked="torch").SummaryWriter

            # purge_step hides the points an interrupted earlier attempt logged past the checkpoint.
            self._writer = _event_file.synchronous(SummaryWriter(
                str(self._open()),
                flush_secs=self._flush_secs,
                purge_step=self._take_purge_step(),
                filename_suffix=f".{os.getpid()}.{next(_WRITER_COUNT):06d}",
            ), self._flush_secs)  # events written by the logging thread: tensorboardX's queue cost ~9 µs a step
        return self._writer


class _NoWriter:
    """`experiment` on a process that does not write: every method call does nothing."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


def _scalars(metrics: Mapping[str, float]) -> Summary:
    from tensorboardX.proto.summary_pb2 import Summary

    return Summary(value=[Summary.Value(tag=k, simple_value=float(v)) for k, v in metrics.items()])


def _compile_table(compiled: Mapping[str, float]) -> str:
    """`compile/<program>_s` values as a Markdown table, the slowest first."""
    rows = sorted(((k[len(_COMPILE):].removesuffix("_s"), float(v)) for k, v in compiled.items()),
                  key=lambda row: -row[1])
    return "\n".join(["| program | compile seconds |", "|---|---:|", *(f"| {name} | {s:.2f} |" for name, s in rows)])


def _text(tag: str, text: str) -> Summary:
    """A summary TensorBoard's text plugin shows (Markdown), as tensorboardX's `add_text` writes it."""
    from tensorboardX.proto.plugin_text_pb2 import TextPluginData
    from tensorboardX.proto.summary_pb2 import Summary, SummaryMetadata
    from tensorboardX.proto.tensor_pb2 import TensorProto
    from tensorboardX.proto.tensor_shape_pb2 import TensorShapeProto

    plugin_data = SummaryMetadata.PluginData(plugin_name="text", content=TextPluginData(version=0).SerializeToString())
    tensor = TensorProto(dtype="DT_STRING", string_val=[text.encode()],
                         tensor_shape=TensorShapeProto(dim=[TensorShapeProto.Dim(size=1)]))
    return Summary(value=[Summary.Value(tag=tag, metadata=SummaryMetadata(plugin_data=plugin_data), tensor=tensor)])


def _session_start(hparams: Mapping[str, Scalar]) -> Summary:
    from tensorboardX.proto.plugin_hparams_pb2 import SessionStartInfo

    start = SessionStartInfo(start_time_secs=time.time())
    for key, value in hparams.items():
        if isinstance(value, bool):
            start.hparams[key].bool_value = value
        elif isinstance(value, (int, float)):
            start.hparams[key].number_value = float(value)
        else:
            start.hparams[key].string_value = value
    return _plugin_summary(_SESSION_START_TAG, session_start_info=start)


def _experiment(hparams: Mapping[str, Scalar], tags: list[str]) -> Summary:
    """The HPARAMS table's columns: the user's hyperparameters marked as differing (TensorBoard
    sorts those first), the results in `_result_order`."""
    from tensorboardX.proto.api_pb2 import (DATA_TYPE_BOOL, DATA_TYPE_FLOAT64, DATA_TYPE_STRING, Experiment,
                                            HParamInfo, MetricInfo, MetricName)

    infos = []
    for key, value in hparams.items():
        kind = (DATA_TYPE_BOOL if isinstance(value, bool) else
                DATA_TYPE_FLOAT64 if isinstance(value, (int, float)) else DATA_TYPE_STRING)
        info = HParamInfo(name=key, type=kind)
        if _is_users(key, hparams):
            info.ParseFromString(info.SerializeToString() + _DIFFERS_TRUE)  # kept as an unknown field
        infos.append(info)
    results = sorted((t for t in tags if not t.startswith(_NOT_RESULTS)), key=_result_order)
    experiment = Experiment(hparam_infos=infos, metric_infos=[MetricInfo(name=MetricName(tag=t)) for t in results])
    return _plugin_summary(_EXPERIMENT_TAG, experiment=experiment)


def _is_users(key: str, hparams: Mapping[str, Scalar]) -> bool:
    """A hyperparameter the user set on their module or data: not one of the CLI's `trainer/...`
    arguments, nor the class path a CLI section chose (`model` beside `model/lr`)."""
    top = key.split("/", 1)[0]
    return top != "trainer" and not any(other.startswith(key + "/") for other in hparams)


def _result_order(tag: str) -> int:
    """Validation results, then the train epoch means, other train values, test results, the rest
    (a stable sort: first-logged order within each)."""
    if tag.startswith("val"):
        return 0
    if tag.startswith("train"):
        return 1 if tag.endswith("_epoch") else 2
    return 3 if tag.startswith("test") else 4


def _session_end() -> Summary:
    from tensorboardX.proto.plugin_hparams_pb2 import SessionEndInfo

    end = SessionEndInfo(status="STATUS_SUCCESS", end_time_secs=time.time())
    return _plugin_summary(_SESSION_END_TAG, session_end_info=end)


def _plugin_summary(tag: str, **data: Any) -> Summary:
    from tensorboardX.proto.plugin_hparams_pb2 import HParamsPluginData
    from tensorboardX.proto.summary_pb2 import Summary, SummaryMetadata

    content = HParamsPluginData(version=0, **data).SerializeToString()
    plugin_data = SummaryMetadata.PluginData(plugin_name=_PLUGIN, content=content)
    metadata = SummaryMetadata(plugin_data=plugin_data)
    return Summary(value=[Summary.Value(tag=tag, metadata=metadata)])


def _heatmap(matrix: Any, cell: int = 16) -> np.ndarray:
    """An RGB uint8 picture of a matrix (`[..., rows, cols]`, leading axes stacked vertically):
    white for 0 through blue for a row's largest share, a grey line between cells. Drawn with
    numpy alone (no matplotlib)."""
    m = np.asarray(matrix, np.float64)
    m = m.reshape(-1, m.shape[-1]) if m.ndim > 2 else np.atleast_2d(m)
    rows = np.abs(m).sum(-1, keepdims=True)
    share = np.divide(np.abs(m), rows, out=np.zeros_like(m), where=rows > 0)
    white, blue = np.array([255.0, 255.0, 255.0]), np.array([8.0, 48.0, 107.0])
    colours = white + share[..., None] * (blue - white)
    picture = np.repeat(np.repeat(colours, cell, 0), cell, 1)
    picture[::cell, :], picture[:, ::cell] = 160.0, 160.0
    return picture.round().astype(np.uint8)
