"""TensorBoardLogger, read back with TensorBoard's own reader and its hparams plugin backend."""

import threading
from pathlib import Path

import pytest
import tensorboardX  # noqa: F401  (imported before the GIL is contended in a test below)
import yaml
from tensorboard import context
from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins import base_plugin
from tensorboard.plugins.hparams import api_pb2, backend_context, list_session_groups, metadata

from fitjax.loggers import TensorBoardLogger


def _read(run_dir: Path) -> EventAccumulator:
    accumulator = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    accumulator.Reload()
    return accumulator


def _points(accumulator: EventAccumulator, tag: str) -> list[tuple[int, float]]:
    return [(e.step, e.value) for e in accumulator.Scalars(tag)]


def _hparams_content(run_dir: Path) -> dict[str, bytes]:
    return _read(run_dir).PluginTagToContent(metadata.PLUGIN_NAME)


def test_scalars_are_written_at_their_global_steps(tmp_path):
    logger = TensorBoardLogger(tmp_path)
    logger.log_metrics({"train/loss": 2.0, "lr": 0.1}, step=10)
    logger.log_metrics({"train/loss": 1.5, "lr": 0.05}, step=20)
    logger.log_metrics({"val/acc": 0.75}, step=20)
    logger.finalize("success")

    accumulator = _read(tmp_path / "fitjax_logs" / "version_0")
    assert set(accumulator.Tags()["scalars"]) == {"train/loss", "lr", "val/acc"}
    assert _points(accumulator, "train/loss") == [(10, 2.0), (20, 1.5)]
    assert _points(accumulator, "lr") == [(10, pytest.approx(0.1)), (20, pytest.approx(0.05))]
    assert _points(accumulator, "val/acc") == [(20, 0.75)]


def _spin(done: threading.Event) -> None:
    while not done.is_set():
        sum(range(1000))


def test_what_was_logged_is_readable_after_save_and_no_thread_writes_it(tmp_path):
    """Events are written by the thread that logs (tensorboardX's queue and writer thread cost a
    tiny step ~11%): `save()` puts every event logged so far on disk, with the file still open."""
    before = set(threading.enumerate())
    busy = threading.Event()  # threads that contend for the GIL, as a loaded machine's would:
    hogs = [threading.Thread(target=_spin, args=(busy,), daemon=True) for _ in range(2)]
    for hog in hogs:  # tensorboardX's queue feeder, left to end by itself, was seen alive in CI
        hog.start()
    logger = TensorBoardLogger(tmp_path, flush_secs=3600)  # no timed flush during the test
    logger.log_metrics({"train/loss": 1.0}, step=1)  # opens the file
    assert set(threading.enumerate()) - before == set(hogs)  # no writer or feeder thread running
    busy.set()
    for hog in hogs:
        hog.join()
    for step in range(2, 201):
        logger.log_metrics({"train/loss": 1.0 / step}, step=step)
    assert set(threading.enumerate()) == before
    logger.save()
    assert len(_points(_read(logger.log_dir), "train/loss")) == 200
    logger.log_metrics({"train/loss": 0.0}, step=201)
    logger.finalize("success")
    assert _points(_read(logger.log_dir), "train/loss")[-1] == (201, 0.0)


def test_hparams_land_in_the_run_folder_itself_with_their_values_and_status(tmp_path):
    logger = TensorBoardLogger(tmp_path, name="exp")
    params = {"lr": 1e-3, "use_ema": True, "act": "gelu", "model": {"width": 64, "sizes": (3, 4)}}
    params["seed"] = None
    logger.log_hyperparams(params)
    logger.log_metrics({"train/loss": 0.5}, step=1)
    logger.log_metrics({"val/loss": 0.7}, step=1)
    logger.finalize("success")

    run_dir = tmp_path / "exp" / "version_0"
    assert [p for p in run_dir.iterdir() if p.is_dir()] == []  # no add_hparams-style sub-run
    content = _hparams_content(run_dir)
    assert set(content) == {metadata.SESSION_START_INFO_TAG, metadata.SESSION_END_INFO_TAG, metadata.EXPERIMENT_TAG}
    # the columns: the hyperparameters marked as differing (TensorBoard ticks the first five of
    # those), the validation results before the train values
    experiment = metadata.parse_experiment_plugin_data(content[metadata.EXPERIMENT_TAG])
    assert {h.name: h.differs for h in experiment.hparam_infos} == dict.fromkeys(
        ["lr", "use_ema", "act", "model/width", "model/sizes", "seed"], True)
    assert [m.name.tag for m in experiment.metric_infos] == ["val/loss", "train/loss"]

    start = metadata.parse_session_start_info_plugin_data(content[metadata.SESSION_START_INFO_TAG])
    values = {k: getattr(v, v.WhichOneof("kind")) for k, v in start.hparams.items()}
    assert values == {
        "lr": pytest.approx(1e-3),
        "use_ema": True,
        "act": "gelu",
        "model/width": 64.0,
        "model/sizes": "(3, 4)",
        "seed": "None",
    }
    end = metadata.parse_session_end_info_plugin_data(content[metadata.SESSION_END_INFO_TAG])
    assert end.status == api_pb2.STATUS_SUCCESS

    assert yaml.safe_load((run_dir / "hparams.yaml").read_text()) == {
        "lr": 1e-3,
        "use_ema": True,
        "act": "gelu",
        "model": {"width": 64, "sizes": [3, 4]},
        "seed": None,
    }


def _hparams_table(logdir: Path) -> tuple[api_pb2.Experiment, api_pb2.ListSessionGroupsResponse]:
    """What the HPARAMS tab gets from the TensorBoard server: the columns and the rows."""
    multiplexer = plugin_event_multiplexer.EventMultiplexer()
    multiplexer.AddRunsFromDirectory(str(logdir))
    multiplexer.Reload()
    provider = data_provider.MultiplexerDataProvider(multiplexer, str(logdir))
    tb_context = base_plugin.TBContext(logdir=str(logdir), multiplexer=multiplexer, data_provider=provider)
    backend = backend_context.Context(tb_context)
    ctx = context.RequestContext()
    experiment = backend.experiment_from_metadata(ctx, "", True, backend.hparams_metadata(ctx, ""), None)
    request = api_pb2.ListSessionGroupsRequest(slice_size=10, allowed_statuses=[api_pb2.STATUS_SUCCESS])
    return experiment, list_session_groups.Handler(ctx, backend, "", request).run()


def test_hparams_table_shows_every_run_with_its_final_metric_values(tmp_path):
    # two runs of one script: the same hyperparameters with other values (TensorBoard takes the
    # first run's experiment summary as every run's columns)
    runs = [
        ({"lr": 0.1, "wd": 0.0}, [{"train/loss": 1.0}, {"train/loss": 0.4, "val/acc": 0.8}]),
        ({"lr": 0.01, "wd": 0.5}, [{"train/loss": 1.0}, {"train/loss": 0.6, "val/acc": 0.9}]),
    ]
    for params, rows in runs:
        logger = TensorBoardLogger(tmp_path)
        logger.log_hyperparams(params)
        for step, row in enumerate(rows):
            logger.log_metrics(row, step=step)
        logger.finalize("success")

    experiment, groups = _hparams_table(tmp_path / "fitjax_logs")
    assert [h.name for h in experiment.hparam_infos] == ["lr", "wd"]
    assert [m.name.tag for m in experiment.metric_infos] == ["val/acc", "train/loss"]  # results first
    table = {
        g.name: (
            {k: v.number_value for k, v in g.hparams.items()},
            {m.name.tag: (round(m.value, 6), m.training_step) for m in g.metric_values},
        )
        for g in groups.session_groups
    }
    assert table == {
        "version_0": ({"lr": 0.1, "wd": 0.0}, {"train/loss": (0.4, 1), "val/acc": (0.8, 1)}),
        "version_1": ({"lr": 0.01, "wd": 0.5}, {"train/loss": (0.6, 1), "val/acc": (0.9, 1)}),
    }


@pytest.mark.parametrize("status", ["failed", "interrupted"])
def test_an_unfinished_run_can_still_end_as_a_success_when_resumed(tmp_path, status):
    logger = TensorBoardLogger(tmp_path)
    logger.log_hyperparams({"lr": 0.1})
    logger.log_metrics({"loss": 1.0}, step=1)
    state = logger.state_dict()
    logger.finalize(status)
    # TensorBoard keeps a run's first end status: an unfinished run leaves it open ("Unknown").
    assert metadata.SESSION_END_INFO_TAG not in _hparams_content(logger.log_dir)

    resumed = TensorBoardLogger(tmp_path)
    resumed.load_state_dict(state)
    resumed.log_hyperparams({"lr": 0.1})
    resumed.log_metrics({"loss": 0.5}, step=2)
    resumed.finalize("success")
    content = _hparams_content(resumed.log_dir)
    end = metadata.parse_session_end_info_plugin_data(content[metadata.SESSION_END_INFO_TAG])
    assert end.status == api_pb2.STATUS_SUCCESS


def test_finalize_is_safe_twice_and_before_anything_was_logged(tmp_path):
    unused = TensorBoardLogger(tmp_path / "unused")
    unused.finalize("failed")
    unused.finalize("failed")
    assert not (tmp_path / "unused").exists()

    logger = TensorBoardLogger(tmp_path)
    logger.log_metrics({"loss": 1.0}, step=0)
    logger.finalize("success")
    logger.finalize("success")
    logger.log_metrics({"loss": 0.5}, step=1)  # after finalize: a new event file in the same run
    logger.finalize("success")
    assert _points(_read(logger.log_dir), "loss") == [(0, 1.0), (1, 0.5)]


def test_finalize_rejects_an_unknown_status(tmp_path):
    match = r"finalize\(status=\.\.\.\)` must be one of .*'interrupted'.*got 'done'"
    with pytest.raises(ValueError, match=match):
        TensorBoardLogger(tmp_path).finalize("done")


def test_versions_count_up_and_can_be_given(tmp_path):
    first, second = TensorBoardLogger(tmp_path), TensorBoardLogger(tmp_path)
    first.log_metrics({"loss": 1.0}, step=0)
    second.log_metrics({"loss": 1.0}, step=0)
    named = TensorBoardLogger(tmp_path, version="baseline")
    numbered = TensorBoardLogger(tmp_path, version=7)
    for logger in (named, numbered):
        logger.log_metrics({"loss": 1.0}, step=0)
    for logger in (first, second, named, numbered):
        logger.finalize("success")

    assert (first.version, second.version) == (0, 1)
    assert first.log_dir == tmp_path / "fitjax_logs" / "version_0"
    assert second.log_dir == tmp_path / "fitjax_logs" / "version_1"
    assert named.log_dir == tmp_path / "fitjax_logs" / "baseline"
    assert TensorBoardLogger(tmp_path).version == 8  # one past the largest version_<N>
    assert _points(_read(second.log_dir), "loss") == [(0, 1.0)]


def test_resume_continues_the_same_folder_without_doubled_points(tmp_path):
    logger = TensorBoardLogger(tmp_path)
    for step in (1, 2, 3):
        logger.log_metrics({"loss": float(step)}, step=step)
    state = logger.state_dict()  # taken with the checkpoint at step 3
    logger.log_metrics({"loss": 40.0}, step=4)  # logged, then the run died before the next checkpoint
    logger.finalize("interrupted")
    assert state == {"version": 0, "step": 3}

    resumed = TensorBoardLogger(tmp_path)
    resumed.load_state_dict(state)
    for step in (4, 5):
        resumed.log_metrics({"loss": float(step)}, step=step)
    resumed.finalize("success")

    assert resumed.log_dir == logger.log_dir
    assert _points(_read(resumed.log_dir), "loss") == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0), (5, 5.0)]


def test_a_process_other_than_zero_writes_nothing(tmp_path):
    logger = TensorBoardLogger(tmp_path, process_index=1)
    logger.log_hyperparams({"lr": 0.1})
    logger.log_metrics({"loss": 1.0}, step=0)
    logger.save()
    logger.finalize("success")
    logger.finalize("success")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"version": -1}, r"TensorBoardLogger\(version=\.\.\.\)` must be None .* got -1"),
        ({"version": "a/b"}, r"got 'a/b'"),
        ({"name": "a/b"}, r"TensorBoardLogger\(name=\.\.\.\)` must be a str without path separators"),
        ({"flush_secs": 0}, r"TensorBoardLogger\(flush_secs=\.\.\.\)` must be a number > 0 \(seconds\); got 0"),
    ],
)
def test_bad_arguments_are_named_in_the_error(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        TensorBoardLogger(tmp_path, **kwargs)


def test_hyperparams_must_be_a_mapping(tmp_path):
    with pytest.raises(TypeError, match=r"log_hyperparams\(params\)` must be a mapping.*got \[1, 2\]"):
        TensorBoardLogger(tmp_path).log_hyperparams([1, 2])
