"""`LitModule`: what to train. The user declares `loss`, `configure_optimizer` and `metrics`."""

from __future__ import annotations

import functools
import inspect
from typing import Any, Mapping

import flax.linen as nn
import optax
from flax import nnx

from fitjax import _logged
from fitjax.module import _host_model, _lightning, _lora, _optimizers, _weight_room, _weights
from fitjax.step import ModuleSpec, context, defined_at
from fitjax.step import learning_rate as lr_lib
from fitjax.step import model_binding
from fitjax.step.model_binding import ModelBinding, Models, bind
from fitjax.module._hparams import AttributeDict, RunAttributeDict, collect_init_args
from fitjax.module._host_model import hook_mode
from fitjax.module._weight_room import WeightsMixin, own_variables
from fitjax._typing import Batch, Metrics, PyTree

__all__ = ["LitModule", "overrides"]


class LitModule(WeightsMixin):
    """The user's training recipe: a flax model plus the loss, metrics and optimizer around it.

    Subclass it, assign a `flax.linen.Module` or `flax.nnx.Module` to `self.model`, and define
    `loss` and `configure_optimizer` (and optionally `metrics`, `predict_step`). Every method that
    receives `model` is traced under `jax.jit`: keep it pure (no Python side effects, no `.item()`).

    Example:
        >>> import fitjax as fj, flax.linen as nn, optax
        >>> class Regressor(fj.LitModule):
        ...     def __init__(self, lr: float = 1e-2):
        ...         super().__init__()
        ...         self.save_hyperparameters()
        ...         self.model = nn.Dense(1)
        ...     def loss(self, model, batch):
        ...         return ((model(batch["x"]) - batch["y"]) ** 2).mean()
        ...     def configure_optimizer(self):
        ...         return optax.sgd(self.hparams.lr)
        >>> Regressor().hparams.lr
        0.01
    """

    #: Linen rng streams the trainer supplies to every call (`self.make_rng(name)` in the model).
    #: NNX models carry their own `nnx.Rngs`, checkpointed with the model state, or take the
    #: step's keys per call from `self.step_rngs()` (these streams).
    rng_streams: tuple[str, ...] = ("dropout",)

    #: Lightning's switch for several optimizers (a GAN). With False, `training_step` returns
    #: `{param group: loss}` and each top-level group of the params is updated by the gradient
    #: of its own loss, in the same jitted step (see docs/porting.md).
    automatic_optimization: bool = True

    #: The model's logical axis names -> mesh axes (`{"embed": "fsdp", "heads": "tensor", ...}`),
    #: for a model whose parameters carry `nn.with_logical_partitioning` names: `fj.strategies.FSDP`
    #: uses them for the names its own `rules` leave out (all of them when it is given none).
    #: `fitjax.models.CausalLMModule` sets `fitjax.models.LOGICAL_RULES`.
    logical_axis_rules: Mapping[str, Any] | None = None

    def __init__(self) -> None:
        self.training: bool = False
        self.trainer: Any = None  # the Trainer running this module (set by fit/validate/test/predict)
        self._hparams = AttributeDict()
        self._binding: ModelBinding | None = None
        self._variables: tuple[PyTree, PyTree] | None = None
        self._weights_load: _weights.WeightsLoad | None = None  # until a build reads it
        self._adapters_load: _weights.WeightsLoad | None = None  # `load_adapters`, placed on top of it
        self._lora: _lora.LoraSpec | None = None
        self._trainable: Any = None  # what the last built optimizer trains (`fitjax.step.trainable`)

    # ----------------------------------------------------------------- user hooks (override these)

    def loss(self, model: Any, batch: Batch) -> Any:
        """Returns a scalar loss, or `(loss, outputs)` where `outputs` is handed to `metrics`.

        A module that defines Lightning's `training_step` (and `validation_step`, `test_step`)
        instead gets this default, which runs those hooks with `self.model` bound.
        """
        if _lightning.is_lightning(self):
            return _lightning.loss(self, model, batch)
        raise NotImplementedError(
            f"{type(self).__name__} must define `loss(self, model, batch)` returning a scalar loss "
            "or `(loss, outputs)`."
        )

    def metrics(self, batch: Batch, outputs: Any) -> Metrics:
        """Per-batch scalar metrics (traced); averaged over examples by the trainer."""
        return {}

    def configure_optimizer(self) -> optax.GradientTransformation:
        """Returns the optax transformation that updates `model`'s parameters.

        Lightning's `configure_optimizers` is used instead when defined: it may return an optax
        transformation, `{"optimizer": tx, "lr_scheduler": optax_schedule}`, or
        `{param group: tx}` for several parameter groups.
        """
        if callable(getattr(type(self), "configure_optimizers", None)):
            return _optimizers.from_configure_optimizers(type(self).__name__, self.configure_optimizers())
        raise NotImplementedError(
            f"{type(self).__name__} must define `configure_optimizer(self)` returning an optax "
            "transformation, e.g. `return optax.adamw(1e-3)`."
        )

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Lightning's `forward`: `self(x)` calls it; by default `self.model(*args, **kwargs)`.

        Inside the traced Lightning-style hooks `self.model` is the bound model. In host hooks
        (`on_train_epoch_end`, a callback's hooks) and after fit, `self.model(...)` and `self(x)`
        run the model with the current weights, jitted once per shape, in train or eval mode as
        `self.training` says (see `fitjax.module._host_model`).
        """
        return self.model(*args, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if _lightning.tracing() or not self._needs_host_model():
            return self.forward(*args, **kwargs)
        with _host_model.installed(self, functools.partial(own_variables, self)):  # host code, no trainer
            return self.forward(*args, **kwargs)

    # ------------------------------------------------------- the run, as Lightning's module sees it

    @property
    def logger(self) -> Any:
        """The trainer's first logger (Lightning's `self.logger`); None without a trainer or logger.
        `self.logger.experiment` is the logger's own object (TensorBoard: the tensorboardX
        `SummaryWriter`, for `add_image` and the like)."""
        return None if self.trainer is None else self.trainer.logger

    @property
    def loggers(self) -> list:
        """The trainer's loggers (Lightning's `self.loggers`); [] without a trainer."""
        return [] if self.trainer is None else list(self.trainer.loggers)

    @property
    def current_epoch(self) -> int:
        """The trainer's current epoch (0 without a trainer), for host hooks (see `global_step`)."""
        self._host_only("current_epoch")
        return 0 if self.trainer is None else self.trainer.current_epoch

    @property
    def global_step(self) -> int:
        """Optimizer steps taken (0 without a trainer), for host hooks. Inside the traced
        `training_step` it is an error: the value would be frozen when the step is traced;
        `batch_idx` there is the global step, traced."""
        self._host_only("global_step")
        return 0 if self.trainer is None else self.trainer.global_step

    def _host_only(self, name: str) -> None:
        if _lightning.tracing():
            raise TypeError(
                f"{type(self).__name__}.{name} was read inside a traced hook, which runs once, when "
                f"the step is compiled: the value would be frozen there. In training_step, "
                f"`batch_idx` is the global step (a traced int32); an epoch-dependent value belongs in "
                f"an optax schedule (a function of the step) or is computed from `batch_idx` and "
                f"`self.trainer.num_training_batches`. Host hooks (on_train_batch_start/_end, "
                f"on_train_epoch_end, ...) may read it: host work per step belongs there."
            )

    def optimizers(self, *args: Any, **kwargs: Any) -> Any:
        """Lightning's manual optimization handle; fitjax's form is a dict of losses (raises)."""
        raise _lightning.manual_optimization_error(type(self).__name__, "optimizers()")

    def lr_schedulers(self, *args: Any, **kwargs: Any) -> Any:
        """Lightning's scheduler handles; schedules are optax functions of the step (raises)."""
        raise _lightning.manual_optimization_error(type(self).__name__, "lr_schedulers()")

    def manual_backward(self, *args: Any, **kwargs: Any) -> None:
        """Lightning's manual backward; fitjax differentiates the returned losses (raises)."""
        raise _lightning.manual_optimization_error(type(self).__name__, "manual_backward(loss)")

    def predict_step(self, model: Any, batch: Batch) -> Any:
        """What `Trainer.predict` returns per batch; by default `model(inputs)`.

        Lightning's `predict_step(self, batch, batch_idx)` is accepted too: fitjax tells the two
        apart by the first parameter's name (`model`: fitjax's form).

        `inputs` is the batch itself when it is an array, or its first element when it is a
        tuple or list (`(x, y)` pairs). Override it for dict batches or richer outputs.
        """
        if isinstance(batch, (tuple, list)):
            batch = batch[0]
        if isinstance(batch, dict):
            raise NotImplementedError(
                f"{type(self).__name__}.predict_step: the batch is a dict with keys {sorted(batch)}, "
                "so fitjax cannot tell which are the inputs. Override "
                "`predict_step(self, model, batch)`, e.g. `return model(batch['image'])`."
            )
        return model(batch)

    def generate_step(self, model: Any, tokens: Any, *, positions: Any, segment_ids: Any, cache: Any) -> Any:
        """One forward pass of `Trainer.generate`, traced: `(logits, new_cache)`.

        `tokens`, `positions` and `segment_ids` are int32 [batch, length]: the left-padded
        prompts (padding has segment id 0), then one new token per row at a time. By default
        `model(tokens, positions=..., segment_ids=..., cache=cache)`, the contract of the models
        in `fitjax.models` and the GPT example: logits [batch, length, vocab] and, with a cache
        (made by the model's `init_cache(batch, max_length, dtype)`), the cache with the new keys
        and values written at `positions`. `cache` is None when the model has no `init_cache`
        (or `generate(use_cache=False)`): return `(logits, None)`. Override it when the model
        takes its inputs otherwise (more arguments, another method).

        Example:
            >>> import fitjax as fj
            >>> class LM(fj.LitModule):
            ...     def generate_step(self, model, tokens, *, positions, segment_ids, cache):
            ...         if cache is None:
            ...             return model.decode(tokens, positions=positions), None
            ...         return model.decode(tokens, positions=positions, cache=cache)
        """
        if cache is None:
            return model(tokens, positions=positions, segment_ids=segment_ids), None
        return model(tokens, positions=positions, segment_ids=segment_ids, cache=cache)

    # ------------------------------------------------------------- extra values (inside loss/metrics)

    def log(self, name: str, value: Any, prog_bar: bool = False, *, on_step: bool | None = None,
            on_epoch: bool | None = None, reduce_fx: str = "mean", **lightning_options: Any) -> None:
        """Logs a scalar computed inside `loss` or `metrics`, as `train/<name>` and `val/<name>`.

        Inside Lightning-style hooks (`training_step`, `validation_step`, `test_step`) the keys
        and defaults are Lightning's: the bare `name` (or `<name>_step` and `<name>_epoch` when
        both `on_step` and `on_epoch`); `on_step=True, on_epoch=False` in `training_step`,
        `on_step=False, on_epoch=True` in evaluation.

        The value is an extra output of the jitted step, averaged over examples on device like
        the metrics `metrics` returns: logging it costs no host transfer.

        Args:
            name: the key under the stage prefix (`"grad_norm"` is logged as `train/grad_norm`).
            value: a scalar array (one value for the batch).
            prog_bar: show it in the progress bar (the loss always is).
            on_step: log the train mean over each `log_every_n_steps` window (default True).
            on_epoch: log the train epoch mean as `train/<name>_epoch` (default True).
                Evaluation always logs one mean per run, `val/<name>` / `test/<name>`, where
                (as for `metrics`) each example is traced on its own and the values averaged.
            reduce_fx: how values are combined; "mean" (weighted by examples).
            **lightning_options: Lightning's `logger`, `sync_dist`, `batch_size`, `rank_zero_only`
                ... are accepted and ignored: values are always reduced over every device and
                weighted by the examples of the batch.

        Example:
            >>> def loss(self, model, batch):
            ...     pred = model(batch["x"])
            ...     self.log("pred_std", pred.std(), prog_bar=True)
            ...     return ((pred - batch["y"]) ** 2).mean()
        """
        _lightning.check_log_options(type(self).__name__, name, lightning_options)
        spec = _logged.LogSpec(prog_bar=prog_bar, on_step=on_step, on_epoch=on_epoch, reduce_fx=reduce_fx)
        spec = _lightning.resolve_spec(spec)  # Lightning's defaults inside training_step & co.
        _logged.record(type(self).__name__, name, value, spec)

    def log_dict(self, values: Metrics, prog_bar: bool = False, *, on_step: bool | None = None,
                 on_epoch: bool | None = None, reduce_fx: str = "mean", **lightning_options: Any) -> None:
        """`log` for each `name: value` of a dict, with the same options."""
        for name, value in dict(values).items():
            self.log(name, value, prog_bar, on_step=on_step, on_epoch=on_epoch, reduce_fx=reduce_fx,
                     **lightning_options)

    def step_rngs(self) -> nnx.Rngs:
        """An `nnx.Rngs` of the step's keys, for NNX code that takes its randomness per call.

        One stream per name in `rng_streams` (default `"dropout"`), drawn from the run's key
        folded with the step, as a Linen model's streams are: different keys every step, the
        same ones when a run resumes. Call it inside `loss` / `training_step` (traced) and pass
        it on; each call starts the streams afresh, so make one per step and share it.

        An `nnx.Rngs(0)` made inside the step instead would give the same keys (the same
        dropout mask) at every step, since the step is compiled once: fitjax refuses it.

        Example:
            >>> class Classifier(fj.LitModule):  # doctest: +SKIP
            ...     def loss(self, model, batch):  # model: an nnx.Module whose __call__(x, rngs) drops out
            ...         logits = model(batch["x"], rngs=self.step_rngs())
            ...         return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()
        """
        return model_binding.step_rngs(tuple(self.rng_streams), type(self).__name__)

    @property
    def dataloader_idx(self) -> int:
        """Which of several validation (test) loaders `loss` and `metrics` are traced for.

        A Python int, so `if self.dataloader_idx == 1:` may choose what to compute or log (a
        module that reads it gets one evaluation step per loader; one that does not shares one
        step). 0 with one loader, in training and in predict. Lightning-style hooks get it as
        `validation_step(self, batch, batch_idx, dataloader_idx=0)`.
        """
        return context.current_dataloader_index()

    # data hooks, as Lightning's: the trainer calls them before it asks for a stage's loaders
    def prepare_data(self) -> None:
        """Downloads or writes data (Lightning's hook); called before `setup`."""

    def setup(self, stage: str) -> None:
        """Builds what `stage` ("fit", "validate", "test" or "predict") needs before its data is
        asked for: the module's own `train_dataloader()`, `val_dataloader()`, ... when defined."""

    def teardown(self, stage: str) -> None:
        """Called when `stage` ends (also after an error), after the callbacks' `teardown`."""

    # lifecycle hooks, called before the callbacks' hooks of the same name
    def on_fit_start(self) -> None: ...
    def on_fit_end(self) -> None: ...
    def on_train_start(self) -> None: ...
    def on_train_end(self) -> None: ...
    def on_train_epoch_start(self) -> None: ...
    def on_train_epoch_end(self) -> None: ...
    def on_validation_epoch_start(self) -> None: ...
    def on_validation_epoch_end(self) -> None: ...
    def on_test_epoch_start(self) -> None: ...
    def on_test_epoch_end(self) -> None: ...

    # Every other Lightning module hook a subclass defines runs as in Lightning, or is refused
    # when a stage starts with why and what to write instead: `fitjax.module.hook_table` lists
    # them all (on_train_batch_start/end, on_validation_start/end, teardown, configure_model,
    # on_before_batch_transfer, ...). Per-batch hooks are called after the callbacks' of the
    # same name, with Lightning's arguments.

    def on_validation_batch_start(self, batch: Any, batch_idx: int) -> None: ...
    def on_test_batch_start(self, batch: Any, batch_idx: int) -> None: ...
    def on_predict_batch_start(self, batch: Any, batch_idx: int) -> None: ...

    # checkpoint hooks, as Lightning's: called after the callbacks' on save, before them on load
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Adds what the module wants kept to a checkpoint being saved (Lightning's hook).

        `checkpoint` is the checkpoint's plain-data item (JSON: the loop position, `hparams`,
        `callbacks`, ...; the arrays are the train state's, saved by Orbax): keys added to it
        are saved and handed back to `on_load_checkpoint`. Values must be JSON data.
        """

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Reads back what `on_save_checkpoint` added, when a fit resumes from a checkpoint,
        `validate/test/predict(ckpt_path=...)` or `load_from_checkpoint` loads one (Lightning's
        hook; called before the callbacks' `on_load_checkpoint`)."""

    # ------------------------------------------------------------------------ hyperparameters

    def save_hyperparameters(self, *names: str, ignore: str | tuple[str, ...] = ()) -> None:
        """Records the calling `__init__`'s arguments as `self.hparams` (logged and checkpointed).

        Args:
            *names: only these arguments (default: all of them).
            ignore: arguments to leave out (e.g. large objects).
        """
        frame = inspect.currentframe().f_back  # the subclass's __init__
        try:
            ignore = (ignore,) if isinstance(ignore, str) else tuple(ignore)
            self._hparams.update(collect_init_args(frame, names=names, ignore=ignore))
        finally:
            del frame

    @property
    def hparams(self) -> AttributeDict:
        """The saved hyperparameters; `self.hparams.lr` or `self.hparams["lr"]`. While one run of
        a `Trainer(runs=[{...}, ...])` fit is traced: that run's values (traced arrays where
        the runs differ)."""
        run = context.current_run_hparams()
        if run is None:
            return self._hparams
        return RunAttributeDict({**self._hparams, **run.values}, run.read)

    # Weights to and from outside a fit (`load_weights`, `save_weights`, `load_adapters`,
    # `load_state_dict`, `load_from_checkpoint`), LoRA (`apply_lora`, `trainable_mask`) and
    # `update_params` are inherited from `WeightsMixin` (fitjax/module/_weight_room.py).

    # ------------------------------------------------------------------ model binding (internal)

    @property
    def variables(self) -> tuple[PyTree, PyTree] | None:
        """`(params, model_state)` after `fit` (or a restore); None before the model is built."""
        return self._variables

    @property
    def variable_order(self) -> tuple[tuple[str, ...], ...]:
        """The paths of the model's arrays (`("Dense_0", "kernel")`) in the model's own order: the
        order a Linen model's layers created them, an NNX model's attribute order (what the model
        summary lists first); empty before a Linen model is built."""
        return self._binding.order if self._binding is not None else ()

    def _model_attribute_names(self) -> tuple[str, ...]:
        """The attributes holding flax models: `("model",)`, else every flax module attribute in
        the order they were set (`self.net`, `self.target_net`; each a parameter group)."""
        if vars(self).get("model") is not None:
            return ("model",)
        return tuple(name for name, v in vars(self).items()
                     if isinstance(_host_model.unwrap(v), (nn.Module, nnx.Module)))

    def _model_attribute_name(self) -> str | None:
        """The attribute holding the flax model when there is one (None with none or several)."""
        names = self._model_attribute_names()
        return names[0] if len(names) == 1 else None

    def _find_model(self) -> Any:
        """The flax model, or a `Models` of several (bound by their attribute names)."""
        names = self._model_attribute_names()
        if len(names) == 1:
            return _host_model.unwrap(vars(self)[names[0]])
        if names:
            return Models({name: _host_model.unwrap(vars(self)[name]) for name in names})
        raise AttributeError(
            f"{type(self).__name__} has no model: assign a flax.linen or flax.nnx module to "
            f"`self.model` (or to attributes such as `self.net`, `self.target_net`) in __init__."
        )

    def _get_binding(self) -> ModelBinding:
        if self._binding is None:
            self._binding = bind(
                self._find_model(), rng_streams=tuple(self.rng_streams), owner=type(self).__name__
            )
        return self._binding

    def _needs_host_model(self) -> bool:
        """Whether a flax model attribute is a Linen module with no weights bound (host code)."""
        return any(isinstance(vars(self)[name], nn.Module) and vars(self)[name].scope is None
                   for name in self._model_attribute_names())

    # ------------------------------------------- what the step layer reads of a module (internal)

    def step_spec(self) -> ModuleSpec:
        """What the trainer's step layer needs of this module, as one frozen value (the trainer
        asks for it once per build; you never call it): the model's binding and variables, the
        traced methods (`loss`, `metrics`, what predict calls), the optimizer, and how the module
        is optimized and evaluated. Raises when the module mixes fitjax's and Lightning's shapes
        in a way fitjax cannot follow."""
        binding = self._get_binding()
        _lightning.check(self, LitModule)
        return ModuleSpec(
            owner=type(self).__name__,
            binding=binding,
            # weights restored with overrides are placed by `weights`, which checks their shapes
            variables=(None if vars(self).get("_restored_with") and vars(self).get("_weights_load")
                       else self.variables or binding.initial_variables()),
            loss=_lightning.binding_models(self, self.loss),  # several models: `self.net` bound too
            metrics=self.metrics,
            predict=_lightning.predict_fn(self, LitModule),
            optimizer=functools.partial(_weight_room.optimizer, self),
            lr_schedule=functools.partial(lr_lib.schedule_of, self),
            # each parameter group updated by the gradient of its own loss (see docs/porting.md)
            manual=_lightning.is_manual(self),
            # a Lightning-style module's `test_step` may log other names than its `validation_step`
            eval_stages=("val", "test") if _lightning.is_lightning(self) else ("val",),
            mode=functools.partial(hook_mode, self),
            defined_at={method: defined_at(self, method) for method in ("loss", "metrics")},
            weights=_weight_room.placer(self),
            axis_rules=self.logical_axis_rules,
        )


# ------------------------------------------------------------------------------------------------
# What fitjax's loop, callbacks and checkpoints do with a module (not for users: they are
# functions, not methods, so they take no names from the user's subclass).


def overrides(module: LitModule, hook: str) -> bool:
    """Whether the module's class defines `hook` itself (the loop calls only those)."""
    return getattr(type(module), hook, None) is not getattr(LitModule, hook, None)
