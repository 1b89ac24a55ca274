"""`LightningCLI`: a `Trainer`, a `LitModule` and a `DataModule` built from the command line and YAML.

The shape is Lightning's: subcommands `fit`, `validate`, `test`, `predict` (and fitjax's `plan`:
`Trainer.plan`, the train step `fit` would run compiled for a target and measured); `--config` files merged
in order, then command-line overrides; `--print_config`; `--trainer.*`, `--model.*`, `--data.*`
read from the classes' `__init__` signatures (types from the hints, help from the docstrings), so
an argument added to `Trainer.__init__` appears here without an edit; callbacks, loggers and the
strategy as `class_path` / `init_args`; optional `optimizer:` / `lr_scheduler:` sections naming optax
functions. jsonargparse does the parsing and the checking; every mistake a user can make (a bad
key or value, an object that cannot be built from the config, a checkpoint that is not there) is
one `error:` line and exit status 2 (`fitjax.cli._errors`), `--debug` gives the traceback.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
import tempfile
import types
import warnings
from pathlib import Path
from typing import Any, Callable, NoReturn, Union

import jax
import yaml
from jsonargparse import ActionConfigFile, ArgumentParser, Namespace, class_from_function
from jsonargparse import ArgumentError as _ArgumentError

# from the modules that define them, not the package: `fitjax` imports `fitjax.cli`
from fitjax import _seed
from fitjax import _storage
from fitjax.callbacks import Callback
from fitjax.cli import _errors, _predictions, _usage
from fitjax.data import DataModule
from fitjax.loop import Trainer
from fitjax.module import LitModule
from fitjax.cli._optax import OptaxOptimizer, build_optimizer
from fitjax.cli.schedules import OptaxSchedule
from fitjax.strategies import initialize_distributed
from fitjax.loggers import config_hparams
from fitjax.loop import resolve_ckpt_path
from fitjax.loop.plan import plans_elsewhere
from fitjax.strategies import agree

__all__ = ["LightningArgumentParser", "LightningCLI", "SaveConfigCallback"]

ArgsType = list[str] | dict[str, Any] | Namespace | None


class LightningArgumentParser(ArgumentParser):
    """jsonargparse's `ArgumentParser` with fitjax's classes and optax sections as argument groups.

    Args:
        description: shown by `--help`.
        env_prefix: prefix of environment variables read when `default_env=True`
            (`FITJAX_TRAINER__MAX_EPOCHS`, ...).
        default_env: read arguments from environment variables too.
        **kwargs: the rest of `jsonargparse.ArgumentParser`'s arguments.
    """

    def __init__(self, *args: Any, description: str = "fitjax command line tool", env_prefix: str = "FITJAX",
                 default_env: bool = False, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)  # `--trainer.max_epoch` is an error, not a guess
        super().__init__(*args, description=description, env_prefix=env_prefix, default_env=default_env, **kwargs)
        self.callback_keys: list[str] = []
        self.optimizer_keys: list[str] = []
        self.lr_scheduler_keys: list[str] = []

    def format_usage(self) -> str:
        """argparse's usage, or a short one where that is wider than 80 columns (`fitjax.cli._usage`)."""
        return _usage.short_usage(self, super().format_usage())

    def format_help(self) -> str:
        """The help with `format_usage`'s usage in place of argparse's."""
        text = super().format_help()
        long_usage = super().format_usage()
        return text.replace(long_usage, self.format_usage(), 1) if text.startswith(long_usage) else text

    def add_argument_group(self, *args: Any, **kwargs: Any) -> Any:
        """argparse's, with the title (a class's docstring's first line) folded to 80 columns."""
        if args:
            args = (_usage.folded_title(args[0]), *args[1:])
        elif "title" in kwargs:
            kwargs["title"] = _usage.folded_title(kwargs["title"])
        return super().add_argument_group(*args, **kwargs)

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        """One `error:` line (with the nearest known key when one is close) and exit status 2.

        With `exit_on_error=False` (what `--debug` sets) the error is raised instead, traceback
        and all, as jsonargparse does.
        """
        if not self.exit_on_error:
            raise _ArgumentError(None, message) from ex
        parser = getattr(ex, "subcommand_parser", None) or self
        prog = parser.prog.replace(" [options]", "")
        _errors.report_error(message, prog=prog, known=_errors.option_names(self) + _errors.option_names(parser))

    def add_lightning_class_args(self, cls: type, nested_key: str, *, subclass_mode: bool = False,
                                 required: bool = True) -> list[str]:
        """Adds `cls.__init__`'s arguments under `nested_key`; returns the keys added.

        Args:
            cls: `Trainer` (or a subclass), a `LitModule`, `DataModule` or `Callback` class, or a
                function annotated to return one (its arguments become the options).
            nested_key: the group's name (`trainer`, `model`, `data`, ...).
            subclass_mode: accept any subclass, chosen with `--<key>=ClassName` or `class_path`.
            required: whether the group must be given (subclass mode).
        """
        allowed = (Trainer, LitModule, DataModule, Callback)
        if callable(cls) and not isinstance(cls, type):  # a function annotated to return one of them
            cls = class_from_function(cls)
        if not (isinstance(cls, type) and issubclass(cls, allowed)):
            raise TypeError(
                f"add_lightning_class_args(cls={cls!r}): cls must be a subclass of Trainer, LitModule, "
                "DataModule or Callback."
            )
        if issubclass(cls, Callback):
            self.callback_keys.append(nested_key)
        if subclass_mode:
            return self.add_subclass_arguments(cls, nested_key, fail_untyped=False, required=required)
        return self.add_class_arguments(cls, nested_key, fail_untyped=False,
                                        instantiate=not issubclass(cls, Trainer), sub_configs=True)

    def add_optimizer_args(self, nested_key: str = "optimizer") -> None:
        """Adds an optional optax optimizer section (`class_path: optax.adamw` + `init_args`)."""
        self.add_argument(f"--{nested_key}", type=OptaxOptimizer | None, default=None,
                          help="An optax optimizer for modules without configure_optimizer, e.g. "
                               "--optimizer=optax.adamw --optimizer.learning_rate=1e-3.")
        self.optimizer_keys.append(nested_key)

    def add_lr_scheduler_args(self, nested_key: str = "lr_scheduler") -> None:
        """Adds an optional optax schedule section driving the optimizer section's learning rate."""
        self.add_argument(f"--{nested_key}", type=OptaxSchedule | None, default=None,
                          help="An optax schedule that replaces the optimizer's learning_rate, e.g. "
                               "--lr_scheduler=warmup_cosine_decay_schedule --lr_scheduler.peak_value=1e-3.")
        self.lr_scheduler_keys.append(nested_key)


class SaveConfigCallback(Callback):
    """Saves the resolved config as `config.yaml` in the run's log dir and logs it as hyperparameters.

    The hyperparameters are the config as a user names it (`model/lr`, the chosen class under
    `model`), without `None`s and without Trainer arguments left at their defaults.

    Only process 0 writes. `fit --config <log_dir>/config.yaml` runs the same run again. A log dir
    on a store (`s3://...`) gets the file through the loggers' file layer.

    Args:
        parser: the parser that parsed `config` (it knows how to dump it).
        config: the subcommand's resolved config.
        config_filename: the file's name in the log dir.
        overwrite: replace an existing file instead of raising.
        multifile: keep the structure of several config files (jsonargparse's `multifile`).
    """

    def __init__(self, parser: LightningArgumentParser, config: Namespace, config_filename: str = "config.yaml",
                 overwrite: bool = False, multifile: bool = False) -> None:
        self.parser = parser
        self.config = config
        self.config_filename = config_filename
        self.overwrite = overwrite
        self.multifile = multifile
        self.already_saved = False

    def setup(self, trainer: Trainer, module: LitModule, stage: str) -> None:
        if self.already_saved:
            return
        log_dir = _storage.folder(trainer.log_dir or trainer.default_root_dir)
        path = log_dir / self.config_filename
        # every process raises together: one alone would leave the others in a collective
        if agree(jax.process_index() == 0 and not self.overwrite and path.exists()):
            raise RuntimeError(
                f"SaveConfigCallback: {str(path)!r} exists; refusing to overwrite a previous run's config. "
                "Delete it, pick another log dir, or pass `LightningCLI(save_config_kwargs={'overwrite': True})`."
            )
        if jax.process_index() == 0:
            if _storage.is_url(log_dir):  # written locally (one file, or several with multifile), then uploaded
                with tempfile.TemporaryDirectory(prefix="fitjax-config-") as local:
                    self.parser.save(self.config, Path(local) / self.config_filename, skip_unset=False,
                                     multifile=self.multifile)
                    _storage.put_folder(Path(local), log_dir)
            else:
                log_dir.mkdir(parents=True, exist_ok=True)
                self.parser.save(self.config, path, skip_unset=False, overwrite=self.overwrite,
                                 multifile=self.multifile)
            hparams = yaml.safe_load(self.parser.dump(self.config, skip_unset=False))
            defaults = {p.name: p.default for p in inspect.signature(type(trainer).__init__).parameters.values()
                        if p.default is not inspect.Parameter.empty}
            for logger in trainer.loggers:
                logger.log_hyperparams(config_hparams(hparams, defaults={"trainer": defaults}))
        self.already_saved = True


class LightningCLI:
    """Builds a `Trainer`, a `LitModule` and optionally a `DataModule` from arguments and configs, then runs.

    In a script, `LightningCLI(MyModule, MyDataModule)` gives `python train.py fit --config c.yaml
    --trainer.max_epochs=5 --model.lr=1e-3`; the `fitjax` console command is
    `LightningCLI()` with `--model.class_path` / `--data.class_path` naming importable classes.

    Args:
        model_class: the `LitModule` to train; None accepts any subclass named with `--model`.
        datamodule_class: the `DataModule`; None accepts any subclass named with `--data` (optional).
        save_config_callback: the callback class saving the config (None: do not save).
        save_config_kwargs: its keyword arguments (`overwrite`, `config_filename`, `multifile`).
        trainer_class: `Trainer` or a subclass.
        trainer_defaults: defaults of `Trainer` arguments; `callbacks` given here are always added.
        parser_kwargs: keyword arguments of the parsers; a key naming a subcommand (`"fit"`)
            holds that subcommand parser's arguments.
        subclass_mode_model: accept subclasses of `model_class` (`--model=OtherModule`).
        subclass_mode_data: accept subclasses of `datamodule_class`.
        args: the arguments (a list as on the command line, or a dict / Namespace config);
            None reads `sys.argv[1:]`.
        run: run the subcommand; with False there are no subcommands and only the objects are built.
        auto_configure_optimizers: add the `optimizer:` / `lr_scheduler:` sections.
        seed_everything_default: the default of `--seed_everything` (Lightning's): an int runs
            `fj.seed_everything(seed)` before the classes are built (Python, numpy, torch) and
            is the trainer's `seed` unless `--trainer.seed` is given; True does the same with
            `PL_GLOBAL_SEED` or 0; False seeds nothing. The seed used is stored in the config.

    After construction: `cli.config` (parsed), `cli.config_init` (objects), `cli.trainer`,
    `cli.model`, `cli.datamodule`, and `cli.result` (what the subcommand returned).

    Example:
        >>> # train.py:  LightningCLI(DigitsClassifier, DigitsData)
        >>> # shell:     python train.py fit --config configs/digits.yaml --trainer.max_epochs=3
    """

    def __init__(
        self,
        model_class: type[LitModule] | Callable[..., LitModule] | None = None,
        datamodule_class: type[DataModule] | Callable[..., DataModule] | None = None,
        save_config_callback: type[SaveConfigCallback] | None = SaveConfigCallback,
        save_config_kwargs: dict[str, Any] | None = None,
        trainer_class: type[Trainer] = Trainer,
        trainer_defaults: dict[str, Any] | None = None,
        parser_kwargs: dict[str, Any] | None = None,
        subclass_mode_model: bool = False,
        subclass_mode_data: bool = False,
        args: ArgsType = None,
        run: bool = True,
        auto_configure_optimizers: bool = True,
        seed_everything_default: bool | int = True,
    ) -> None:
        if not isinstance(seed_everything_default, (bool, int)):
            raise TypeError(f"LightningCLI(seed_everything_default=...) takes True, False or an int, "
                            f"got {seed_everything_default!r}.")
        self.seed_everything_default = seed_everything_default
        self.save_config_callback = save_config_callback
        self.save_config_kwargs = save_config_kwargs or {}
        self.trainer_class = trainer_class
        self.trainer_defaults = trainer_defaults or {}
        self.auto_configure_optimizers = auto_configure_optimizers
        self.model_class = model_class
        self._model_class = model_class or LitModule
        self.subclass_mode_model = model_class is None or subclass_mode_model
        self.datamodule_class = datamodule_class
        self._datamodule_class = datamodule_class or DataModule
        self.subclass_mode_data = datamodule_class is None or subclass_mode_data
        self.result: Any = None
        if args is None:
            args = sys.argv[1:]
        self.debug = False
        if isinstance(args, (list, tuple)):
            args, self.debug = _errors.take_debug_flag([str(a) for a in args])

        parser_kwargs = parser_kwargs or {}
        main_kwargs = {k: v for k, v in parser_kwargs.items() if k not in self.subcommands()}
        sub_kwargs = {k: v for k, v in parser_kwargs.items() if k in self.subcommands()}
        self.setup_parser(run, main_kwargs, sub_kwargs)
        if self.debug:  # parse errors raise, with their traceback
            for parser in [self.parser, *getattr(self, "_subcommand_parsers", {}).values()]:
                parser.exit_on_error = False
        self.parse_arguments(self.parser, args)
        self.subcommand: str | None = self.config["subcommand"] if run else None

        self._set_seed()
        with self._user_errors("building the objects of the config"):
            self.before_instantiate_classes()
            self.instantiate_classes()
            self.after_instantiate_classes()
        if self.subcommand is not None:
            self._run_subcommand(self.subcommand)

    @contextlib.contextmanager
    def _user_errors(self, doing: str):
        """An exception while `doing` what the config asks is the user's to fix: one `error:` line, exit 2.

        Only the steps that act on the config alone are wrapped (building the objects, resolving
        `ckpt_path`, checking `--output`), never training itself: a failure there keeps its traceback.
        """
        try:
            yield
        except SystemExit:
            raise
        except Exception as exc:  # noqa: BLE001 - each is reported, with --debug re-raised as is
            if self.debug:
                raise
            prog = self._parser(self.subcommand).prog.replace(" [options]", "")
            _errors.report_error(str(exc) or f"{type(exc).__name__} while {doing}", prog=prog)

    # ------------------------------------------------------------------------------- parser

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        """The subcommands, each with the `Trainer` method arguments that are not options."""
        return {
            "fit": {"module", "train_data", "val_data", "datamodule", "model", "train_dataloaders",
                    "val_dataloaders"},
            "validate": {"module", "data", "datamodule", "model", "dataloaders"},
            "test": {"module", "data", "datamodule", "model", "dataloaders"},
            "predict": {"module", "data", "datamodule", "model", "dataloaders", "return_predictions"},
            "plan": {"module", "train_data", "datamodule", "strategy"},  # the strategy: --trainer.strategy
        }

    def init_parser(self, **kwargs: Any) -> LightningArgumentParser:
        """A parser with `-c/--config` (which also gives `--print_config`)."""
        parser = LightningArgumentParser(**kwargs)
        parser.add_argument("-c", "--config", action=ActionConfigFile,
                            help="A YAML or JSON config file; several are merged in order, later ones win.")
        return parser

    def setup_parser(self, add_subcommands: bool, main_kwargs: dict, sub_kwargs: dict) -> None:
        """Builds `self.parser`, with a parser per subcommand when `add_subcommands`."""
        self.parser = self.init_parser(**main_kwargs)
        if not add_subcommands:
            self._add_arguments(self.parser)
            return
        self._subcommand_parsers: dict[str, LightningArgumentParser] = {}
        self._subcommand_method_arguments: dict[str, list[str]] = {}
        group = self.parser.add_subcommands()
        for name, skip in self.subcommands().items():
            method = getattr(self.trainer_class, name)
            description = (inspect.getdoc(method) or "").split("\n")[0] or None
            kwargs = dict(sub_kwargs.get(name, {}))
            kwargs.setdefault("description", description)
            sub = self.init_parser(**kwargs)
            self._add_arguments(sub)
            self._subcommand_method_arguments[name] = sub.add_method_arguments(
                self.trainer_class, name, skip=set(skip), fail_untyped=False)
            if name == "predict":
                _predictions.add_output_argument(sub)
            if name == "plan":
                sub.add_argument("--json", action="store_true", help="Print the plan as JSON instead of a table.")
            self._subcommand_parsers[name] = sub
            group.add_subcommand(name, sub, help=description)

    def _add_arguments(self, parser: LightningArgumentParser) -> None:
        parser.add_argument("--seed_everything", type=Union[bool, int], default=self.seed_everything_default,
                            help="An int runs seed_everything with it before the classes are built (and is "
                                 "the trainer's seed unless --trainer.seed is given); True: PL_GLOBAL_SEED "
                                 "or 0; False: no seeding.")
        parser.add_lightning_class_args(self.trainer_class, "trainer")
        parser.set_defaults({f"trainer.{k}": v for k, v in self.trainer_defaults.items() if k != "callbacks"})
        parser.add_lightning_class_args(self._model_class, "model", subclass_mode=self.subclass_mode_model)
        parser.add_lightning_class_args(self._datamodule_class, "data", subclass_mode=self.subclass_mode_data,
                                        required=self.datamodule_class is not None)
        self.add_arguments_to_parser(parser)
        if self.auto_configure_optimizers:
            if not parser.optimizer_keys:
                parser.add_optimizer_args()
            if not parser.lr_scheduler_keys:
                parser.add_lr_scheduler_args()

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """Override to add arguments (`parser.add_argument`, `parser.link_arguments`, ...)."""

    def parse_arguments(self, parser: LightningArgumentParser, args: ArgsType) -> None:
        """Parses `args` (or `sys.argv[1:]`) into `self.config`; exits with status 2 on bad input."""
        if isinstance(args, (dict, Namespace)):
            self.config = parser.parse_object(args)
        else:
            self.config = parser.parse_args(args)

    def _parser(self, subcommand: str | None) -> LightningArgumentParser:
        return self.parser if subcommand is None else self._subcommand_parsers[subcommand]

    def _get(self, config: Namespace, key: str, default: Any = None) -> Any:
        return config.get(str(self.subcommand), config).get(key, default)

    def _set_seed(self) -> None:
        """Lightning's `--seed_everything`: seeds the host's generators before anything is built
        and records the seed used in the config (and as the trainer's seed when it has none)."""
        self._trainer_seed = None
        config = self.config.get(str(self.subcommand), self.config)
        seed = config.get("seed_everything")
        if seed is False or seed is None:
            return
        # torch is seeded when imported (the module's and datamodule's files are, by now), not imported: ~3 s
        seed = _seed.resolve_seed(None if seed is True else seed, verbose=False)
        _seed.seed_host(seed, import_torch=False)
        config["seed_everything"] = seed  # a rerun of the saved config seeds the same
        self._trainer_seed = seed  # the trainer's key too, unless the config gives trainer.seed

    # ------------------------------------------------------------------------------ objects

    def before_instantiate_classes(self) -> None:
        """Override to run code before the classes are built."""

    def after_instantiate_classes(self) -> None:
        """Override to run code after the classes are built."""

    def instantiate_classes(self) -> None:
        """Builds the callbacks, loggers, strategy, module and datamodule, then the trainer."""
        # jax.distributed starts before a module's __init__ can touch a device (an NNX model
        # allocates its parameters there); the Trainer does it too, then finds it started.
        initialize_distributed(self._get(self.config, "trainer").get("num_nodes"))
        self.config_init = self.parser.instantiate(self.config)
        self.datamodule = self._get(self.config_init, "data")
        self.model = self._get(self.config_init, "model")
        self._add_configure_optimizer_to_model()
        self.trainer = self.instantiate_trainer()

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        """Builds the trainer from the `trainer` group, the extra callbacks and the config saver."""
        config = {**dict(self._get(self.config_init, "trainer")), **kwargs}
        if config.get("seed") is None and getattr(self, "_trainer_seed", None) is not None:
            config["seed"] = self._trainer_seed
        parser = self._parser(self.subcommand)
        callbacks = config.get("callbacks") or []
        callbacks = list(callbacks) if isinstance(callbacks, (list, tuple)) else [callbacks]
        callbacks += [self._get(self.config_init, key) for key in parser.callback_keys]
        defaults = self.trainer_defaults.get("callbacks") or []
        callbacks += list(defaults) if isinstance(defaults, (list, tuple)) else [defaults]
        if self.save_config_callback is not None and not config.get("fast_dev_run"):
            callbacks.append(self.save_config_callback(
                parser, self.config.get(str(self.subcommand), self.config), **self.save_config_kwargs))
        config["callbacks"] = callbacks
        self._plan_strategy = None
        if self.subcommand == "plan":  # a slice's mesh is built over its devices, not this machine's
            target = self.config_init["plan"].get("target")
            if plans_elsewhere(target, config.get("strategy", "auto")):
                self._plan_strategy = config.pop("strategy", "auto")
        return self.trainer_class(**config)

    def _where_fit_wrote(self) -> str:
        """The line a CLI fit ends with: where its logs and checkpoints are."""
        line = f"fit: logs in {self.trainer.log_dir}"
        callback = self.trainer.checkpoint_callback
        if callback is not None and callback.dirpath is not None:
            line += f", checkpoints in {callback.dirpath}"
            if callback.best_model_path:
                line += f" (best: {callback.best_model_path})"
        return line

    def _add_configure_optimizer_to_model(self) -> None:
        """Gives the module the optimizer of the `optimizer:` section, if the config has one."""
        if not self.auto_configure_optimizers:
            return
        parser = self._parser(self.subcommand)
        # the parsed specs, not jsonargparse's instances: the schedule goes into the optimizer
        optimizer = self._get(self.config, parser.optimizer_keys[0]) if parser.optimizer_keys else None
        schedule = self._get(self.config, parser.lr_scheduler_keys[0]) if parser.lr_scheduler_keys else None
        if optimizer is None:
            if schedule is not None:
                parser.error("lr_scheduler is set but optimizer is not: the schedule drives the "
                             "optimizer's learning_rate; add e.g. --optimizer=optax.adamw.")
            return
        cls = type(self.model)
        own = any(name in vars(klass) for klass in cls.__mro__ if klass not in LitModule.__mro__
                  for name in ("configure_optimizer", "configure_optimizers"))
        if own:
            warnings.warn(f"`{cls.__name__}.configure_optimizer` is replaced by the config's `optimizer:` section.",
                          stacklevel=2)
        tx = build_optimizer(optimizer.as_dict(), schedule.as_dict() if schedule is not None else None)
        self.model.configure_optimizer = types.MethodType(lambda module: tx, self.model)

    # --------------------------------------------------------------------------------- run

    def _run_subcommand(self, subcommand: str) -> None:
        before = getattr(self, f"before_{subcommand}", None)
        if callable(before):
            before()
        method = getattr(self.trainer, subcommand)
        kwargs = {k: v for k, v in self.config_init[subcommand].items()
                  if k in self._subcommand_method_arguments[subcommand]}
        output = self.config_init[subcommand].get("output") if subcommand == "predict" else None
        with self._user_errors("checking the command's arguments"):
            if kwargs.get("ckpt_path") is not None:
                with warnings.catch_warnings():  # the trainer warns itself, once, when it resolves it
                    warnings.simplefilter("ignore")
                    resolve_ckpt_path(self.trainer, kwargs["ckpt_path"], where="--ckpt_path")
            if output is not None:
                _predictions.check_output(output)
        if self.datamodule is not None:
            kwargs["datamodule"] = self.datamodule
        if subcommand == "plan" and self._plan_strategy is not None:
            kwargs["strategy"] = self._plan_strategy
        self.result = method(self.model, **kwargs)
        if self.trainer.is_global_zero:
            if subcommand == "predict":
                print(_predictions.report(self.result, output))
            elif subcommand == "fit":
                print(self._where_fit_wrote())
            elif subcommand == "plan":
                print(self.result.to_json() if self.config_init["plan"].get("json") else self.result.render())
        after = getattr(self, f"after_{subcommand}", None)
        if callable(after):
            after()
