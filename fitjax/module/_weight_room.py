"""A `LitModule`'s weights to and from outside a fit, and their placement when a trainer builds.

`LitModule.load_weights`, `load_adapters`, `apply_lora`, `save_weights`, `update_params` and
`load_from_checkpoint` delegate here (their docstrings, on `LitModule`, are the reference). What
they leave pending lives on the module (`LitModule.__init__` starts it empty; `step_spec` reads
it): `_weights_load` (the base weights to place), `_adapters_load` (LoRA adapters placed on top),
`_lora` (the `LoraSpec` of `apply_lora`), `_trainable` (what the last built optimizer trains),
`_restored_with` (a Linen restore with overrides, to explain a mismatch in its terms) and
`_params_edits` (`update_params`' functions, until the loop takes them).

The step layer gets `placer(module)`: None when nothing is pending, else the function that reads
each pending array straight into the strategy's sharding when the state is built.
"""

from __future__ import annotations

import functools
import os
import warnings
from typing import Any

import jax
import optax

from fitjax import checkpoint
from fitjax._typing import PyTree
from fitjax.module import _lightning, _lora, _weight_sources, _weights
from fitjax.step import trainable
from fitjax.step.model_binding import ModelsBinding, NNXBinding

LitModule = Any  # a `fitjax.LitModule`, which imports this module (so this one cannot import it)

__all__ = ["initial_variables", "is_unfitted_linen", "own_variables", "set_variables", "take_params_edits",
           "weights_to_save"]


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


def update_params(module: LitModule, fn) -> None:
    """`module.update_params(fn)`: checked, then kept for the loop (`take_params_edits`)."""
    owner = type(module).__name__
    if _lightning.tracing() or isinstance(jax.numpy.zeros(()), jax.core.Tracer):  # inside a jit trace
        raise RuntimeError(f"{owner}.update_params(...) writes weights between steps: call it from a host "
                           "hook (`on_train_batch_end`, ...), not inside the traced step.")
    if not callable(fn):
        raise TypeError(f"{owner}.update_params(fn) takes a function `params -> new params`, got "
                        f"{type(fn).__name__}: {fn!r}; to set a tree `new`, pass `lambda _: new`.")
    if module.trainer is None or getattr(module.trainer.stage, "name", None) != "fit":
        raise RuntimeError(f"{owner}.update_params(...) acts on the weights of a running fit: call it "
                           "from a hook of `Trainer.fit` (after fit, the weights are `module.variables`).")
    module.__dict__.setdefault("_params_edits", []).append(fn)


def take_params_edits(module: LitModule) -> list:
    """The `update_params` functions the module's hooks asked for since the last call (the loop
    applies them, in order, before the next step); [] when none (one dict lookup)."""
    return module.__dict__.pop("_params_edits", None) or []


# ------------------------------------------------------------------------------- checkpoints


def load_from_checkpoint(cls: type, path: str | os.PathLike, run: int | None, overrides: dict) -> Any:
    """`cls.load_from_checkpoint(path, run=run, **overrides)`."""
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


# ------------------------------------------------------------------------ weights from outside


def load_weights(module: LitModule, source: Any, *, mapping: _weights.NameMap, transpose: _weights.Transpose,
                 strict: bool) -> _weights.WeightsReport | None:
    """`module.load_weights(...)`: the load checked now when the model's arrays are known."""
    load = _weights.WeightsLoad.make(source, mapping=mapping, transpose=transpose, strict=strict,
                                     owner=type(module).__name__)
    known = module.variables or module._get_binding().initial_variables()
    report = None
    if known is not None:  # checked now; read when a trainer builds the state
        abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), known)
        report = load.plan(_weights.target_names(abstract), _optional_names(module, abstract))[1]
    module._weights_load = load
    return report


def save_weights(module: LitModule, path: str | os.PathLike, *, mapping: _weights.NameMap,
                 transpose: _weights.Transpose, dtype: Any, metadata: dict[str, str] | None,
                 lora: str) -> dict[str, tuple[int, ...]]:
    """`module.save_weights(...)`: one safetensors file, written by process 0."""
    if module.variables is None:
        raise ValueError(f"{type(module).__name__}.save_weights({str(path)!r}): the module has no weights yet; "
                         "fit it, or restore it (`load_from_checkpoint`) first.")
    arrays = _weights.export_arrays(weights_to_save(module, lora), mapping=mapping, transpose=transpose,
                                    dtype=dtype, owner=type(module).__name__)
    if jax.process_index() == 0:
        _weight_sources.save_safetensors(arrays, path, metadata)
    return {name: a.shape for name, a in arrays.items()}


def load_adapters(module: LitModule, source: Any, *, mapping: _weights.NameMap) -> None:
    """`module.load_adapters(...)`: after `apply_lora`, the adapters to place on the base."""
    if vars(module).get("_lora") is None:
        raise ValueError(f"{type(module).__name__}.load_adapters({source!r}): the model has no adapters; call "
                         "`apply_lora(...)` with the targets and rank the adapters were trained with first.")
    module._adapters_load = _weights.WeightsLoad.make(source, mapping=mapping, transpose=(), strict=True,
                                                      owner=type(module).__name__)


# ------------------------------------------------------------------------------------ LoRA


def apply_lora(module: LitModule, targets: str, *, rank: int, alpha: float | None, dropout: float,
               quantize: str | None, example_input: Any) -> None:
    """`module.apply_lora(...)`: the model attribute replaced by the adapted copy."""
    owner = type(module).__name__
    spec = _lora.LoraSpec.make(targets=targets, rank=rank, alpha=alpha, dropout=dropout, owner=owner,
                               quantize=quantize)
    if vars(module).get("_lora") is not None:
        raise ValueError(f"{owner}.apply_lora was called before: the model has adapters already.")
    name = module._model_attribute_name()
    model = module._find_model()
    if module.variables is not None:  # the fitted weights become the base of the adapted model
        module._weights_load = _own_load(module.variables, owner)
    example = () if example_input is None else (
        tuple(example_input) if isinstance(example_input, tuple) else (example_input,))
    setattr(module, name, spec.wrap(model, example, owner))
    module._lora, module._binding, module._variables = spec, None, None


def optimizer(module: LitModule) -> optax.GradientTransformation:
    """The module's optimizer, over the adapters alone after `apply_lora`; what it trains is kept
    for `trainable_mask`."""
    tx = module.configure_optimizer()
    lora = vars(module).get("_lora")
    tx = tx if lora is None else lora.optimizer(tx)
    module._trainable = trainable.of(tx)
    return tx


def trainable_mask(module: LitModule, params: PyTree) -> PyTree:
    """`module.trainable_mask(params)`: None before a build or when every parameter trains."""
    found = vars(module).get("_trainable")
    return None if found is None else found.mask(params)


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
