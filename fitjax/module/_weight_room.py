"""A `LitModule`'s weights to and from outside a fit, and their placement when a trainer builds.

`WeightsMixin` holds what a user calls (`load_weights`, `save_weights`, `load_adapters`,
`apply_lora`, `trainable_mask`, `update_params`, `load_from_checkpoint`): `LitModule` inherits it,
as Lightning's `LightningModule` inherits its hyperparameter and hook mixins, and its API page
lists these methods with its own. What they leave pending lives on the module (`LitModule.__init__`
starts it empty; `step_spec` reads it): `_weights_load` (the base weights to place), `_adapters_load`
(LoRA adapters placed on top), `_lora` (the `LoraSpec` of `apply_lora`), `_trainable` (what the last
built optimizer trains), `_restored_with` (a Linen restore with overrides, to explain a mismatch in
its terms) and `_params_edits` (`update_params`' functions, until the loop takes them).

The loop, checkpoints and the step layer get functions (they take no names from the user's
subclass): a module's own weights, what a save writes, `update_params`' edits, the optimizer, and
`placer(module)`: None when nothing is pending, else the function that reads each pending array
straight into the strategy's sharding when the state is built.
"""

from __future__ import annotations

import functools
import os
import warnings
from typing import Any, Callable, Self

import jax
import optax

from fitjax import checkpoint
from fitjax._typing import PyTree
from fitjax.module import _lightning, _lora, _weight_sources, _weights
from fitjax.step import trainable
from fitjax.step.model_binding import ModelsBinding, NNXBinding

LitModule = Any  # a `fitjax.LitModule`, which imports this module (so this one cannot import it)

__all__ = ["WeightsMixin", "initial_variables", "is_unfitted_linen", "own_variables", "set_variables", "take_params_edits",
           "weights_to_save"]


class WeightsMixin:
    """The weight methods of `LitModule`: loading, saving, LoRA, and writing weights during a fit.

    `LitModule` inherits them (they are documented on its page); they act on what `LitModule`
    holds: its model attributes, `variables`, `trainer` and the pending loads its `__init__`
    starts empty.
    """

    # ------------------------------------------------------------------ weights from outside

    def load_weights(self, source: Any, *, mapping: _weights.NameMap = None,
                     transpose: _weights.Transpose = (), strict: bool = True) -> _weights.WeightsReport | None:
        """Starts the next fit (or validate, test, predict) from weights saved elsewhere.

        The source is read when the trainer builds the state: each array straight into the
        strategy's sharding, a safetensors file read slice by slice (under fsdp each process
        reads only the rows its devices hold), an Orbax tree shard by shard. Arrays the source
        lacks keep their initialised values (with `strict=False`). After the fit,
        `module.variables` holds the trained weights and the load is done.

        Names: the model's arrays are named by their dotted paths, `block_0.up.kernel` (the
        model summary lists them), model state too (`batch_stats.BatchNorm_0.mean`).

        Args:
            source: a `.safetensors` file; a Hugging Face model folder (`config.json` with
                `model.safetensors`, or shards listed in `model.safetensors.index.json`); a plain
                Orbax tree folder; a fitjax checkpoint folder (its `params` and `model_state`);
                a `.msgpack` file of `flax.serialization`; or a mapping `{name: array}`
                (flat or nested; numpy, jax or torch tensors: a `state_dict()`).
            mapping: renames the source's names to the model's: a dict `{regex: replacement}`
                (the first pattern that matches a whole name wins; `\\1` refers to its groups;
                a replacement None drops the array), or a function `name -> new name | None`.
            transpose: the model's arrays (regexes) whose layout is the source's transposed: a
                regex or list of them (axes reversed: torch `Linear.weight` [out, in] into a
                flax kernel [in, out]), or `{regex: axis order}`.
            strict: whether every array of the model must come from the source and every array
                of the source must name one of the model (Lightning's `strict`).

        Returns:
            The report (loaded names, `missing_keys`, `unexpected_keys`) when the model's arrays
            are known now (an NNX model, or a Linen one after a fit); None for a Linen model not
            built yet, whose load is checked when the trainer builds it (`strict=False`: a
            warning lists what was missing or unexpected).

        Raises:
            ValueError: naming each array whose shape or dtype differs (floats load into any
                float dtype), each name given twice, and with `strict` each missing and unexpected
                name; at the call when the model's arrays are known, else when fit builds.

        Example:
            >>> # module.load_weights("gpt2/model.safetensors", mapping={r"h\\.(\\d+)\\.(.*)": r"block_\\1.\\2"})
            >>> # fj.Trainer(strategy="fsdp").fit(module, data)
        """
        load = _weights.WeightsLoad.make(source, mapping=mapping, transpose=transpose, strict=strict,
                                         owner=type(self).__name__)
        known = self.variables or self._get_binding().initial_variables()
        report = None
        if known is not None:  # checked now; read when a trainer builds the state
            abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), known)
            report = load.plan(_weights.target_names(abstract), _optional_names(self, abstract))[1]
        self._weights_load = load
        return report

    def load_state_dict(self, state_dict: Any, strict: bool = True) -> _weights.WeightsReport | None:
        """Lightning's `load_state_dict`: `load_weights(state_dict, strict=strict)` (the names are
        the model's own, `block_0.up.kernel`; `load_weights` maps others)."""
        return self.load_weights(state_dict, strict=strict)

    def save_weights(self, path: str | os.PathLike, *, mapping: _weights.NameMap = None,
                     transpose: _weights.Transpose = (), dtype: Any = None,
                     metadata: dict[str, str] | None = None, lora: str = "merge") -> dict[str, tuple[int, ...]]:
        """Writes the module's weights (`variables`, after a fit or a restore) as one
        `.safetensors` file, the format `transformers`, `safe_open` and `load_weights` read: the
        inverse of `load_weights`, with the same rules read the other way.

        Args:
            path: the file to write (its folder must exist); only process 0 writes.
            mapping: renames the model's names to the file's (a dict `{regex: replacement}`, or a
                function; None drops an array).
            transpose: the model's arrays (regexes) whose axes are reversed in the file, or
                `{regex: axis order}` (the order `load_weights` would be given to read it back).
            dtype: floats are written in this dtype (`jnp.bfloat16`, ...); None keeps theirs.
            metadata: strings stored in the file's header (`{"format": "pt"}` for transformers).
            lora: with `apply_lora` adapters: "merge" writes each adapted weight as
                `W + A @ B * alpha / rank` and no adapter (the model to export); "adapters"
                writes the adapters alone (the small file to keep or share); "keep" writes both
                as they are.

        Returns:
            `{name in the file: shape}` of what was written.

        Example:
            >>> # module.save_weights("out/model.safetensors", mapping={r"(.*)\\.kernel": r"\\1.weight"},
            >>> #                     transpose=r".*kernel", metadata={"format": "pt"})
        """
        if self.variables is None:
            raise ValueError(f"{type(self).__name__}.save_weights({str(path)!r}): the module has no weights yet; "
                             "fit it, or restore it (`load_from_checkpoint`) first.")
        arrays = _weights.export_arrays(weights_to_save(self, lora), mapping=mapping, transpose=transpose,
                                        dtype=dtype, owner=type(self).__name__)
        if jax.process_index() == 0:
            _weight_sources.save_safetensors(arrays, path, metadata)
        return {name: a.shape for name, a in arrays.items()}

    def load_adapters(self, source: Any, *, mapping: _weights.NameMap = None) -> None:
        """Starts the next fit (or evaluation) with the LoRA adapters `save_weights(...,
        lora="adapters")` wrote, on top of the base weights (`load_weights`, or the module's own):
        call it after `apply_lora` with the same targets and rank.

        Every adapter of the model must be in the source and every array of the source must be
        an adapter of the model; the base weights are not expected from it.

        Args:
            source: what `load_weights` reads (a `.safetensors` file, a mapping, ...).
            mapping: renames the source's names to the model's, as in `load_weights`.

        Example:
            >>> # module.load_weights("base.safetensors"); module.apply_lora(r".*", rank=8)
            >>> # module.load_adapters("adapters.safetensors"); trainer.validate(module, data)
        """
        if vars(self).get("_lora") is None:
            raise ValueError(f"{type(self).__name__}.load_adapters({source!r}): the model has no adapters; call "
                             "`apply_lora(...)` with the targets and rank the adapters were trained with first.")
        self._adapters_load = _weights.WeightsLoad.make(source, mapping=mapping, transpose=(), strict=True,
                                                        owner=type(self).__name__)

    # ------------------------------------------------------------------------------- LoRA

    def apply_lora(self, targets: str = ".*", *, rank: int = 8, alpha: float | None = None, dropout: float = 0.0,
                   quantize: str | None = None, example_input: Any = None) -> None:
        """Adds LoRA adapters (Google's qwix) to the layers `targets` names; from then on only the
        adapters train, and only they hold optimizer state.

        Each matmul of a matching layer gets `x @ A @ B * alpha / rank` added, `A`
        (`<weight>_lora_a`, [inputs, rank]) and `B` (`<weight>_lora_b`, [rank, outputs], zeros:
        training starts from the base model exactly) created beside the weight. The optimizer
        `configure_optimizer` returns is applied to the adapters; the base weights get
        `optax.set_to_zero` (unchanged, no state). Weights the module holds (after a fit) or
        `load_weights` gives become the base; the adapters are not expected from a source.
        `save_weights` merges the adapters into the base for export, or writes them alone.

        Sharding: each adapter inherits its base weight's logical axis names (`A` the input
        axis, `B` the output axis; the rank axis unsharded), so under `fj.strategies.FSDP` with
        rules they are sharded as the weight is; unannotated, FSDP's size rule applies (small
        adapters stay replicated).

        Args:
            targets: a regex on the layers' module paths (`r".*(q_proj|v_proj)"`, `"block_.*/up"`
                for Linen's `/`-joined paths; `".*"`: every matmul with a weight).
            rank: the adapters' inner size.
            alpha: the scale's numerator (`alpha / rank`); default `2 * rank`.
            dropout: dropout on the adapters' input (qwix applies it in evaluation too).
            quantize: QLoRA: the adapted weights held in this type by qwix (`"int8"`, `"int4"`,
                `"nf4"`, `"float8_e4m3fn"`): a weight becomes an integer `qvalue` and a float
                `scale` (`up.kernel.array.qvalue`, `.scale`), frozen like the rest of the base.
                Weights the module holds or `load_weights` gives are read as floats and
                quantized when the trainer builds the state; `save_weights` exports floats.
                None: the base stays in its own dtype (LoRA).
            example_input: an input of the model, for an NNX model (qwix runs it once to create
                the adapters): one array, or a tuple of the positional inputs.
        """
        owner = type(self).__name__
        spec = _lora.LoraSpec.make(targets=targets, rank=rank, alpha=alpha, dropout=dropout, owner=owner,
                                   quantize=quantize)
        if vars(self).get("_lora") is not None:
            raise ValueError(f"{owner}.apply_lora was called before: the model has adapters already.")
        name = self._model_attribute_name()
        model = self._find_model()
        if self.variables is not None:  # the fitted weights become the base of the adapted model
            self._weights_load = _own_load(self.variables, owner)
        example = () if example_input is None else (
            tuple(example_input) if isinstance(example_input, tuple) else (example_input,))
        setattr(self, name, spec.wrap(model, example, owner))
        self._lora, self._binding, self._variables = spec, None, None

    def trainable_mask(self, params: PyTree) -> PyTree:
        """A tree of bools like `params`: False where the optimizer of the last fit freezes the
        parameter (LoRA's base weights, a `fj.param_groups` group given None), which then gets
        no gradient and no optimizer state; None when every parameter trains (or before a fit)."""
        found = vars(self).get("_trainable")  # set by `optimizer` when a build asks for it
        return None if found is None else found.mask(params)

    # ------------------------------------------------------------------------ checkpoints

    @classmethod
    def load_from_checkpoint(cls, path: str | os.PathLike, *, run: int | None = None, **overrides: Any) -> Self:
        """Rebuilds the module from a checkpoint: `cls(**saved hparams, **overrides)` holding the
        saved weights, ready for `Trainer.predict` (no trainer state or optimizer needed).

        A checkpoint of a `Trainer(runs=...)` fit holds every run: `run=i` rebuilds run i (with
        the hyperparameters it trained with, and its weights).

        Example:
            >>> # module = MyModule.load_from_checkpoint(ckpt.best_model_path, lr=1e-4)
            >>> # predictions = fj.Trainer().predict(module, data)
        """
        path, kwargs, meta = checkpoint.module_init_args(cls, path, overrides)
        runs = _runs_of_checkpoint(cls, path, meta, run)
        if runs is not None:  # every run's weights stacked on a leading axis: run `run`'s
            module = cls(**{**kwargs, **runs["hparams"][run], **overrides})
            set_variables(module, *jax.tree.map(lambda x: x[run], checkpoint.restore_variables(path)))
            module.on_load_checkpoint(meta)
            return module
        module = cls(**kwargs)
        like = initial_variables(module)  # an NNX model's: the shapes are checked now
        variables = checkpoint.restore_variables(path, like)
        set_variables(module, *variables)
        if like is None and overrides:
            # A Linen model's shapes are known at its first build (from a batch): the weights are
            # placed then, checked against what these hyperparameters build, mismatches named.
            module._weights_load = _own_load(variables, cls.__name__)
            module._restored_with = _weights.RestoredWith(cls.__name__, str(path), overrides, meta.get("hparams", {}))
        module.on_load_checkpoint(meta)  # Lightning's `load_from_checkpoint` calls it too
        return module

    # ----------------------------------------------------------- weights written from a host hook

    def update_params(self, fn: Callable[[PyTree], PyTree]) -> None:
        """Writes new weights from a host hook: the trainer replaces its parameters with
        `fn(params)` before the next step (Lightning's `self.target_net.load_state_dict(...)`).

        `fn` gets the current parameters (a dict keyed by model name with several models) and
        returns a tree of the same structure, shapes and dtypes, checked. The new arrays take the
        old ones' shardings as fresh buffers, so the step still donates its state; the edit is part
        of the train state, so checkpoints record it and a resumed run continues bitwise. The
        optimizer state is left as it is. Call it from one of the module's own host hooks of `fit`
        (`on_train_batch_end`, `on_train_epoch_end`, ...): the edit is applied when that hook
        returns; several calls apply in order.

        Example:
            >>> def on_train_batch_end(self, outputs, batch, batch_idx):  # doctest: +SKIP
            ...     if self.global_step % self.hparams.sync_rate == 0:  # a DQN's target sync
            ...         self.update_params(lambda p: {**p, "target_net": p["net"]})
        """
        owner = type(self).__name__
        if _lightning.tracing() or isinstance(jax.numpy.zeros(()), jax.core.Tracer):  # inside a jit trace
            raise RuntimeError(f"{owner}.update_params(...) writes weights between steps: call it from a host "
                               "hook (`on_train_batch_end`, ...), not inside the traced step.")
        if not callable(fn):
            raise TypeError(f"{owner}.update_params(fn) takes a function `params -> new params`, got "
                            f"{type(fn).__name__}: {fn!r}; to set a tree `new`, pass `lambda _: new`.")
        if self.trainer is None or getattr(self.trainer.stage, "name", None) != "fit":
            raise RuntimeError(f"{owner}.update_params(...) acts on the weights of a running fit: call it "
                               "from a hook of `Trainer.fit` (after fit, the weights are `module.variables`).")
        self.__dict__.setdefault("_params_edits", []).append(fn)  # `take_params_edits` hands them to the loop


# ------------------------------------------------------------------------ the module's weights


def own_variables(module: LitModule) -> tuple[PyTree, PyTree, Any] | None:
    """`(params, model_state, rng)` of the module's own weights (after fit or a restore); else None."""
    if module.variables is None:
        return None
    return (*module.variables, jax.random.PRNGKey(0))


def set_variables(module: LitModule, params: PyTree, model_state: PyTree) -> None:
    """Gives the module these weights (what `module.variables` returns; an NNX model holds them);
    a pending `load_weights` is done (the build that placed it is what gave these)."""
    module._variables = (params, model_state)
    module._weights_load = module._adapters_load = None
    module._restored_with = None
    binding = module._get_binding()
    if isinstance(binding, (NNXBinding, ModelsBinding)):
        binding.update_model(params, model_state)


def initial_variables(module: LitModule) -> tuple[PyTree, PyTree]:
    """Freshly initialised `(params, model_state)` of the module's model: the tree to restore into."""
    return module._get_binding().initial_variables()


def is_unfitted_linen(module: LitModule) -> bool:
    """Whether the module's model is a Linen model (one of several) that no fit, restore nor load
    gave weights."""
    return (module.variables is None and module._weights_load is None and vars(module).get("_adapters_load") is None
            and module._get_binding().initial_variables() is None)


def weights_to_save(module: LitModule, lora: str = "merge") -> tuple[PyTree, PyTree]:
    """`(params, model_state)` as `save_weights(lora=...)` writes them: with `apply_lora`
    adapters merged ("merge"), alone ("adapters") or both ("keep")."""
    spec = vars(module).get("_lora")
    if spec is None:
        return module.variables
    return _lora.saved(module.variables, spec, lora, type(module).__name__)


# ----------------------------------------------------------- weights written from a host hook


def take_params_edits(module: LitModule) -> list:
    """The `update_params` functions the module's hooks asked for since the last call (the loop
    applies them, in order, before the next step); [] when none (one dict lookup)."""
    return module.__dict__.pop("_params_edits", None) or []


# ------------------------------------------------------------------------------- checkpoints


def _runs_of_checkpoint(cls: type, path: Any, meta: dict, run: int | None) -> dict | None:
    """The runs a checkpoint holds (`Trainer(runs=...)`), checked against `run`; None for one."""
    runs = meta.get("runs")
    where = f"{cls.__name__}.load_from_checkpoint({str(path)!r}, run={run!r})"
    if runs is None:
        if run is not None:
            raise ValueError(f"{where}: the checkpoint holds one run (not a Trainer(runs=...) fit); drop `run=`.")
        return None
    count = len(runs["seeds"])
    if isinstance(run, bool) or not isinstance(run, int) or not 0 <= run < count:
        raise ValueError(f"{where}: the checkpoint holds {count} runs ({', '.join(runs['names'])}); pass "
                         f"`run=` an index from 0 to {count - 1}.")
    return runs


def _own_load(variables: tuple[PyTree, PyTree], owner: str) -> _weights.WeightsLoad:
    """A strict load of these weights (NNX rng state left out): to place them at the next build."""
    rng = _weights.rng_names(variables)
    arrays = {n: a for n, a in _weights.flat_arrays(variables).items() if n not in rng}
    return _weights.WeightsLoad.make(arrays, mapping=None, transpose=(), strict=True, owner=owner)


# ------------------------------------------------------- the optimizer (LoRA: the adapters alone)


def optimizer(module: LitModule) -> optax.GradientTransformation:
    """The module's optimizer, over the adapters alone after `apply_lora`; what it trains is kept
    for `trainable_mask`."""
    tx = module.configure_optimizer()
    lora = vars(module).get("_lora")
    tx = tx if lora is None else lora.optimizer(tx)
    module._trainable = trainable.of(tx)
    return tx


# ---------------------------------------------------------------- placement (when a build asks)


def placer(module: LitModule):
    """What the step layer calls to place the pending loads (`ModuleSpec.weights`); None when
    nothing is pending."""
    if vars(module).get("_weights_load") is None and vars(module).get("_adapters_load") is None:
        return None
    return functools.partial(_place_all, module)


def _place_all(module: LitModule, abstract, shardings, initial):
    """The pending loads placed: the base (`load_weights`), then the adapters on top."""
    base, adapters = vars(module).get("_weights_load"), vars(module).get("_adapters_load")
    if base is not None:
        placed = _place_weights(module, base, abstract, shardings, initial)
        initial = lambda: placed  # noqa: E731
    if adapters is None:
        return placed
    names = frozenset(_weights.target_names(abstract))
    return adapters.place(abstract, shardings, initial, names - _lora.adapter_names(names))[0]


def _place_weights(module: LitModule, load: _weights.WeightsLoad, abstract, shardings, initial):
    lora = vars(module).get("_lora")
    try:
        if lora is not None and lora.quantize is not None:  # QLoRA: floats read, then quantized
            optional = _optional_names(module, (_lora.float_abstract(abstract[0]), abstract[1]))
            variables, report = _lora.place_quantized(functools.partial(load.place, optional=optional),
                                                      abstract, shardings, initial)
        else:
            variables, report = load.place(abstract, shardings, initial, _optional_names(module, abstract))
    except ValueError as error:
        restored = vars(module).get("_restored_with")
        if restored is None:
            raise
        raise ValueError(restored.explain(error)) from None
    if report.missing_keys or report.unexpected_keys:
        warnings.warn(f"{type(module).__name__}.load_weights from {load.source.description}: "
                      f"{len(report.loaded)} arrays loaded; missing (kept as initialised): "
                      f"{report.missing_keys}; unexpected (ignored): {report.unexpected_keys}.", stacklevel=2)
    return variables


def _optional_names(module: LitModule, abstract) -> frozenset[str]:
    """The model's arrays a load need not give: NNX rng state, and LoRA adapters (new)."""
    optional = _weights.rng_names(abstract)
    if vars(module).get("_lora") is not None:
        optional |= _lora.adapter_names(_weights.target_names(abstract))
    return optional
