"""`LightningCLI` in-process: configs and overrides, every subcommand, objects from config, bad input."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import jax
import numpy as np
import optax
import pytest
import yaml
from cli_parts import PlainRegressor, Regressor, RegressorData, small_regressor

import fitjax as fj
from fitjax.cli import LightningCLI

QUIET = {"enable_progress_bar": False, "enable_model_summary": False}


def run_cli(*args, model_class=Regressor, datamodule_class=RegressorData, **kwargs) -> LightningCLI:
    kwargs.setdefault("trainer_defaults", QUIET)
    return LightningCLI(model_class, datamodule_class, args=[str(a) for a in args], **kwargs)


def exits_with(capsys, *args, **kwargs) -> tuple[int, str, str]:
    """The exit status, stdout and stderr of a run that exits."""
    with pytest.raises(SystemExit) as exited:
        run_cli(*args, **kwargs)
    out, err = capsys.readouterr()
    return exited.value.code, out, err


def host_params(cli: LightningCLI):
    return jax.device_get(cli.model.variables[0])


def assert_bitwise_equal(a, b):
    jax.tree.map(np.testing.assert_array_equal, a, b)


def test_overrides_beat_later_configs_beat_earlier_configs_beat_defaults(tmp_path):
    first, second = tmp_path / "first.yaml", tmp_path / "second.yaml"
    first.write_text(yaml.safe_dump({"trainer": {"max_steps": 3, "seed": 5}, "model": {"lr": 0.1}}))
    second.write_text(yaml.safe_dump({"model": {"lr": 0.2}}))
    cli = run_cli("--config", first, "--config", second, "--trainer.seed=7", run=False)
    assert cli.model.hparams.lr == 0.2  # the later file
    assert cli.trainer.max_steps == 3  # the first file, untouched by the second
    assert cli.trainer.seed == 7  # the command line after both
    assert cli.datamodule.batch_size == 32  # RegressorData's default
    assert cli.trainer.log_every_n_steps == 50  # Trainer's default
    # order on the command line decides: a file given after an override wins over it
    cli = run_cli("--model.lr=0.3", "--config", second, run=False)
    assert cli.model.hparams.lr == 0.2


def test_args_as_a_dict_and_a_function_as_the_model_class():
    cli = LightningCLI(small_regressor, RegressorData, run=False,
                       args={"trainer": {"max_steps": 2}, "model": {"lr": 0.5}, "data": {"batch_size": 8}})
    assert isinstance(cli.model, Regressor) and cli.model.hparams == {"lr": 0.5, "batchnorm": False}
    assert cli.trainer.max_steps == 2 and cli.datamodule.batch_size == 8


def _session_start_hparams(run_dir: Path) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import metadata

    accumulator = EventAccumulator(str(run_dir))
    accumulator.Reload()
    content = accumulator.PluginTagToContent(metadata.PLUGIN_NAME)[metadata.SESSION_START_INFO_TAG]
    start = metadata.parse_session_start_info_plugin_data(content)
    return {k: getattr(v, v.WhichOneof("kind")) for k, v in start.hparams.items()}


def test_print_config_and_saved_config_reproduce_the_run_bitwise(tmp_path, capsys):
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump({
        "trainer": {"max_steps": 6, "deterministic": True, "log_every_n_steps": 2,
                    "default_root_dir": str(tmp_path / "runs"), "enable_checkpointing": False,
                    "strategy": {"class_path": "fitjax.strategies.FSDP", "init_args": {"min_size_to_shard": 0}}},
        "model": {"lr": 0.02},
    }))
    args = ["fit", "--config", base, "--data.batch_size=16"]
    code, out, _ = exits_with(capsys, *args, "--print_config")
    assert code == 0
    printed = tmp_path / "printed.yaml"
    printed.write_text(out)

    first = run_cli(*args)
    saved = Path(first.trainer.log_dir) / "config.yaml"
    again = run_cli("fit", "--config", saved)
    from_print = run_cli("fit", "--config", printed)

    def resolved(cli):
        config = cli.config.fit.clone()
        del config["config"]
        return config.as_dict()

    assert isinstance(first.trainer.strategy, fj.strategies.FSDP)
    assert first.trainer.global_step == 6
    for other in (again, from_print):
        assert resolved(other) == resolved(first)
        assert_bitwise_equal(host_params(other), host_params(first))
    assert len({cli.trainer.log_dir for cli in (first, again, from_print)}) == 3  # a new version each
    # logged as hyperparameters: the HPARAMS tab shows the config's keys
    # as a user names them: the chosen class under its key, no Nones, no Trainer defaults
    hparams = _session_start_hparams(Path(first.trainer.log_dir))
    assert hparams["trainer/max_steps"] == 6 and hparams["model/lr"] == pytest.approx(0.02)
    assert hparams["trainer/strategy"] == "fitjax.strategies.FSDP"
    assert hparams["trainer/strategy/min_size_to_shard"] == 0
    assert "None" not in hparams.values() and not any("class_path" in k or "init_args" in k for k in hparams)
    assert {k for k in hparams if k.startswith("trainer/") and "/strategy" not in k} == {
        "trainer/max_steps", "trainer/deterministic", "trainer/log_every_n_steps", "trainer/default_root_dir",
        "trainer/enable_checkpointing", "trainer/enable_progress_bar", "trainer/enable_model_summary"}
    # TensorBoard ticks the first five in name order: the module's and the data's come first
    assert sorted(hparams)[:2] == ["data/batch_size", "data/seed"] and sorted(hparams)[3] == "model/lr"


def test_every_subcommand_runs_and_reads_ckpt_path(tmp_path, capsys):
    common = ["--trainer.default_root_dir", tmp_path]  # each run logs to a new version folder
    fit = run_cli("fit", "--trainer.max_epochs=2", *common)
    ckpt = fit.trainer.checkpoint_callback.last_model_path
    assert fit.trainer.global_step == 8 and ckpt
    # the last line of a fit says where its logs and checkpoints went
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith(f"fit: logs in {fit.trainer.log_dir}, checkpoints in ")
    assert str(Path(ckpt).parent) in last
    (val,) = run_cli("validate", "--ckpt_path", ckpt, *common).result
    assert val["val/loss"] == pytest.approx(float(fit.trainer.callback_metrics["val/loss"]), rel=1e-5)
    (test,) = run_cli("test", "--ckpt_path", ckpt, *common).result
    assert set(test) >= {"test/loss", "test/mae"} and np.isfinite(test["test/loss"])
    predictions = run_cli("predict", "--ckpt_path", ckpt, *common).result
    expected = fit.trainer.predict(fit.model, datamodule=fit.datamodule)
    assert predictions.shape == (77, 1)
    np.testing.assert_allclose(predictions, expected, rtol=1e-6)
    assert "77 rows (predictions float32[1]), not saved: pass --output FILE" in capsys.readouterr().out
    # --output writes them, and says where and how many
    for name in ("preds.npy", "preds.csv"):
        run_cli("predict", "--ckpt_path", ckpt, "--output", tmp_path / name, *common)
        out = capsys.readouterr().out
        assert f"predict: wrote 77 rows (predictions float32[1]) to {tmp_path / name}" in out
    np.testing.assert_allclose(np.load(tmp_path / "preds.npy"), expected, rtol=1e-6)
    with open(tmp_path / "preds.csv") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["predictions"] and len(rows) == 78
    np.testing.assert_allclose(np.array(rows[1:], dtype=np.float32), expected, rtol=1e-6)


def test_plan_prints_the_table_or_json_of_the_step_fit_would_run(tmp_path, capsys):
    common = ["--trainer.default_root_dir", tmp_path, "--trainer.strategy=fsdp", "--trainer.precision=bf16-mixed"]
    cli = run_cli("plan", "--json", *common)
    out = json.loads(capsys.readouterr().out)
    assert out["target"] == "local" and out["devices"] == 8 and out["recommended"] == "as configured"
    [candidate] = out["candidates"]
    assert candidate["mesh"] == {"data": 1, "fsdp": 8, "tensor": 1} and candidate["precision"] == "bf16-mixed"
    assert candidate["memory"]["peak"] == cli.result.candidates[0].memory["peak"] > 0
    assert not (tmp_path / "fitjax_logs").exists()  # a plan writes nothing
    run_cli("plan", "--trainer.strategy=dp")
    assert "plan for local: 8 × cpu" in capsys.readouterr().out


def test_subclasses_callbacks_logger_optimizer_and_schedule_from_config(tmp_path):
    steps = 8
    cli = run_cli(
        "fit", "--model=PlainRegressor", "--model.width=8", "--data=RegressorData", "--data.batch_size=16",
        f"--trainer.max_steps={steps}", "--trainer.log_every_n_steps=1",
        "--trainer.callbacks+=EarlyStopping", "--trainer.callbacks.monitor=val/loss", "--trainer.callbacks.patience=5",
        "--trainer.callbacks+=LearningRateMonitor",
        "--trainer.logger=CSVLogger", f"--trainer.logger.save_dir={tmp_path}",
        "--optimizer=optax.adamw", "--optimizer.learning_rate=1.0", "--optimizer.weight_decay=0.0",
        "--lr_scheduler=linear_schedule", "--lr_scheduler.init_value=0.0",
        "--lr_scheduler.end_value=0.004", f"--lr_scheduler.transition_steps={steps}",
        model_class=None, datamodule_class=None,
    )
    assert isinstance(cli.model, PlainRegressor) and cli.model.hparams.width == 8
    early = [cb for cb in cli.trainer.callbacks if isinstance(cb, fj.EarlyStopping)]
    assert len(early) == 1 and early[0].monitor == "val/loss" and early[0].patience == 5
    assert any(isinstance(cb, fj.LearningRateMonitor) for cb in cli.trainer.callbacks)
    assert isinstance(cli.trainer.logger, fj.CSVLogger)
    log_dir = Path(cli.trainer.log_dir)
    saved = yaml.safe_load((log_dir / "config.yaml").read_text())
    assert saved["optimizer"]["class_path"] == "optax.adamw"
    assert saved["lr_scheduler"]["class_path"] == "fitjax.cli.schedules.linear_schedule"
    # the rate applied at each step is the schedule's (read by LearningRateMonitor from the state;
    # rows are at Lightning's 0-based step: the update at step s used schedule(s))
    with open(log_dir / "metrics.csv") as f:
        rows = [row for row in csv.DictReader(f) if row.get("lr")]
    schedule = optax.linear_schedule(0.0, 0.004, steps)
    assert len(rows) == steps
    for row in rows:
        assert float(row["lr"]) == pytest.approx(float(schedule(int(row["step"]))), abs=1e-9)
    assert cli.trainer.global_step == steps


def test_a_module_with_its_own_optimizer_is_warned_when_the_config_replaces_it():
    with pytest.warns(UserWarning, match="Regressor.configure_optimizer` is replaced"):
        cli = run_cli("--optimizer=optax.sgd", "--optimizer.learning_rate=0.5", run=False)
    assert isinstance(cli.model.configure_optimizer(), optax.GradientTransformation)


@pytest.mark.parametrize("args, expected", [
    (["fit", "--trainer.max_epoch=3"], ["--trainer.max_epoch=3"]),
    (["fit", "--trainer.max_epochs=abc"], ["trainer.max_epochs", "abc", "int"]),
    (["fit", "--model.lr=fast"], ["model.lr", "fast", "float"]),
    (["fit", "--trainer.callbacks+=NoSuchCallback"], ["trainer.callbacks", "NoSuchCallback"]),
    (["fit", "--optimizer=optax.sgd", "--optimizer.momentm=0.9"], ["momentm", "optax.sgd"]),
    (["fit", "--lr_scheduler=linear_schedule", "--lr_scheduler.init_value=0", "--lr_scheduler.end_value=1",
      "--lr_scheduler.transition_steps=2"], ["lr_scheduler is set but optimizer is not"]),
    (["fitt"], ["fitt", "fit", "validate", "test", "predict"]),
])
def test_bad_keys_and_types_exit_2_naming_them(capsys, args, expected):
    code, _, err = exits_with(capsys, *args)
    assert code == 2
    for text in expected:
        assert text in err
    assert_one_error_line(err)


def assert_one_error_line(err: str) -> str:
    """What a user reads on a mistake: one `error:` line, then one `tip:` line, no usage, no traceback."""
    lines = err.strip().splitlines()
    assert len(lines) == 2, err
    assert lines[0].startswith("error: ") and lines[1].startswith("tip: ") and "--debug" in lines[1]
    return lines[0]


@pytest.mark.parametrize("args, expected", [
    (["fit", "--trainer.max_epoch=3"], "(did you mean --trainer.max_epochs?)"),
    (["fit", "--model.lrr=0.1"], "(did you mean --model.lr?); --model takes lr, batchnorm"),
    (["fit", "--data.batch_sise=3"], "(did you mean --data.batch_size?); --data takes batch_size, seed"),
    (["fitt"], "(did you mean fit?)"),
])
def test_a_near_key_is_suggested(capsys, args, expected):
    code, _, err = exits_with(capsys, *args)
    assert code == 2 and assert_one_error_line(err).endswith(expected)


@pytest.mark.parametrize("where", ["command line", "config"])
def test_an_argument_the_class_path_class_does_not_take_gets_did_you_mean_and_the_valid_names(
        tmp_path, capsys, where):
    # `fitjax fit --model.class_path ...`: the module's arguments are known only once its class is
    # chosen, so the parser's list of options cannot suggest them; the class's own signature does
    chosen = ["--model.class_path=cli_parts.Regressor", "--data.class_path=cli_parts.RegressorData"]
    if where == "config":
        config = tmp_path / "typo.yaml"
        config.write_text(yaml.safe_dump({"model": {"class_path": "cli_parts.Regressor", "init_args": {"lrr": 0.1}}}))
        typo, key = ["--config", config], "model.init_args."
    else:
        typo, key = ["--model.lrr=0.1"], "--model."
    code, _, err = exits_with(capsys, "fit", *chosen, *typo, model_class=None, datamodule_class=None)
    assert code == 2
    assert assert_one_error_line(err) == (f"error: {key}lrr: cli_parts.Regressor takes no argument 'lrr' (did you mean "
                                          f"{key}lr?); it takes lr, batchnorm")


@pytest.mark.parametrize("args, expected", [
    (["fit", "--trainer.strategy=fsd"], "Trainer(strategy=...) got 'fsd'"),
    (["fit", "--trainer.strategy=FSDP", "--trainer.strategy.fsdp=3"], "FSDP(fsdp=3) does not divide the 8 devices"),
    (["fit", "--trainer.accelerator=gpu"], "Trainer(accelerator='gpu'): JAX has no gpu backend"),
    (["validate", "--ckpt_path=/no/such/checkpoint"], "'/no/such/checkpoint'"),
    (["validate", "--ckpt_path=best", "--trainer.enable_checkpointing=false"], "needs a ModelCheckpoint"),
    (["predict", "--output=predictions.txt"], "--output='predictions.txt': the file must end in one of"),
])
def test_objects_and_checkpoints_the_config_cannot_give_exit_2_on_one_line(capsys, args, expected):
    code, _, err = exits_with(capsys, *args)
    assert code == 2 and expected in assert_one_error_line(err)


def test_debug_shows_the_traceback(capsys):
    with pytest.raises(ValueError, match="got 'fsd'"):
        run_cli("fit", "--trainer.strategy=fsd", "--debug")
    with pytest.raises(Exception, match="max_epoch"):  # jsonargparse's ArgumentError, raised
        run_cli("fit", "--trainer.max_epoch=3", "--debug")


def test_a_bad_key_in_a_config_file_exits_2_naming_it(tmp_path, capsys):
    config = tmp_path / "bad.yaml"
    config.write_text(yaml.safe_dump({"trainer": {"max_epoch": 3}}))
    code, _, err = exits_with(capsys, "fit", "--config", config)
    assert code == 2 and "max_epoch" in assert_one_error_line(err)


def test_help_documents_trainer_model_and_data_arguments(capsys):
    code, out, _ = exits_with(capsys, "fit", "--help")
    assert code == 0
    for option in ("--trainer.max_epochs", "--trainer.precision", "--model.lr", "--data.batch_size", "--ckpt_path",
                   "--optimizer", "--lr_scheduler", "--print_config"):
        assert option in out
    assert "rows per batch" in out  # RegressorData's docstring
    assert "stop after this many epochs" in out and "by global norm" in out  # Trainer's
    # every Trainer argument is an option, whatever Trainer.__init__ grows
    import inspect

    for name in inspect.signature(fj.Trainer.__init__).parameters:
        if name != "self":
            assert f"--trainer.{name}" in out


@pytest.mark.parametrize("subcommand", ["fit", "validate", "test", "predict", "plan"])
def test_help_fits_80_columns_with_a_usage_naming_the_top_level_options(capsys, monkeypatch, subcommand):
    monkeypatch.setenv("COLUMNS", "80")  # argparse's width: an 80-column terminal
    code, out, _ = exits_with(capsys, subcommand, "--help")
    assert code == 0
    wide = [line for line in out.splitlines() if len(line) > 80]
    assert not wide, f"{len(wide)} lines wider than 80 columns, e.g. {wide[:3]}"
    usage = out.split("\n\n")[0]
    assert usage.startswith("usage: ") and "--GROUP.ARGUMENT VALUE ..." in usage and "-c CONFIG" in usage
    assert "--trainer.max_epochs" not in usage and "--trainer.max_epochs" in out  # listed once, below


def test_a_command_without_the_cli_extra_names_the_extra_and_the_install_command():
    """README's first install has no jsonargparse: `fitjax fit` says what to install, no traceback."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['jsonargparse'] = None\n"  # as if not installed
            "from fitjax.cli import main; main(['fit', '--config', 'examples/configs/digits.yaml'])")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "fitjax fit reads configs with jsonargparse" in result.stderr
    assert "pip install 'fitjax[cli]'" in result.stderr
