"""Evaluation: what `Trainer.validate`, `test`, `predict` and fit's validations run, as functions
of what they need (the compiled programs, the strategy, the hooks, the loaders) that return
values (`Evaluated`, host predictions, the programs built for a module); the Trainer records them.

`run_stage`, `run_predict` and `run_validation` are a whole evaluation with its hooks and logs,
given `EvalParts` (what every evaluation uses) and the programs in use (`Built`); they never
read or write the Trainer, which they only hand on to the hooks.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import sys
import warnings
from typing import Any, Callable, Iterator, Mapping, TypeVar

import jax
import numpy as np

from fitjax import metrics as acc_lib
from fitjax import step as step_lib
from fitjax import _logged, checkpoint
from fitjax import module as module_lib
from fitjax._typing import Batch, HostMetrics
from fitjax.data import as_loader, as_loaders, batch_size_of, checked_batches, pad_batch
from fitjax.loop import _arguments
from fitjax.loop import _checks as checks
from fitjax.loop._checks import maybe_len
from fitjax.loop import _resume, _step_outputs, _token_ids
from fitjax.loop._host_hooks import HostHooks, with_transfer_hooks
from fitjax.loop.fit_run import Built, FitRun
from fitjax.loop.metric_log import MetricLog
from fitjax.loop.progress import Progress
from fitjax.strategies import Strategy, gather_rows

__all__ = ["EvalParts", "Evaluated", "build_for", "eval_batches", "evaluate", "hooked", "load_weights",
           "predict_batches", "run_predict", "run_stage", "run_validation", "stage_loaders", "val_batch_counts",
           "warn_unfitted", "with_weights"]

log = logging.getLogger("fitjax")

_FITJAX = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # the package folder
_DATA = {"val": "validation", "test": "test", "predict": "predict"}  # the stage's data, in messages
_METHOD = {"val": "validate", "test": "test", "predict": "predict"}  # the Trainer method of each stage


T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class EvalParts:
    """What an evaluation is given, the same for all of its batches.

    Attributes:
        trainer: handed on to the hooks as their first argument; never read here.
        hooks: the loop's one way to call a hook (`HostHooks`; fit's are the profiler's wrapped ones).
        metric_log: where the evaluation's values are logged (`callback_metrics`, the loggers).
        strategy: places the batches and variables on the devices.
        limits: each stage's batch limit (`Trainer.limits`).
    """

    trainer: Any
    hooks: HostHooks
    metric_log: MetricLog
    strategy: Strategy
    limits: Mapping[str, int | float | None]


def run_stage(parts: EvalParts, module, built: Built, loaders, variables, *, stage: str) -> list[HostMetrics]:
    """`validate`'s or `test`'s evaluation of `loaders` with its hooks, its values logged;
    returns what it logged (`callback_metrics` that changed), one dict per loader."""
    earlier = dict(parts.metric_log.callback_metrics)

    def run() -> None:
        evaluated = evaluate(parts.trainer, module, built.compiled, built.built_from, parts.hooks, loaders, *variables,
                             stage=stage, limit=parts.limits[stage], strategy=parts.strategy)
        parts.metric_log.log(evaluated.values, aliases=evaluated.aliases, pictures=evaluated.pictures)

    hooked(parts.hooks, parts.trainer, module, {"val": "validation", "test": "test"}[stage], run)
    logged = {k: v for k, v in parts.metric_log.callback_metrics.items() if earlier.get(k) is not v}
    if len(loaders) == 1:
        return [logged]
    return [_logged.of_loader(logged, i) for i in range(len(loaders))]


def run_predict(parts: EvalParts, module, built: Built, loader, variables, *, keep: bool) -> list:
    """`predict`'s batches with their hooks: every batch's outputs on the host (none with `keep=False`)."""
    return hooked(parts.hooks, parts.trainer, module, "predict", lambda: predict_batches(
        parts.trainer, module, built.compiled, built.built_from, parts.hooks, loader, variables,
        limit=parts.limits["predict"], strategy=parts.strategy, keep=keep))


def run_validation(parts: EvalParts, run: FitRun, pieces, *, limit, progress: Progress | None = None) -> None:
    """A validation inside fit of `run`'s validation data, with its hooks, on its train state's
    eval parameters (`pieces`: an EMA's copy where one asks) as they are once the start hooks
    ran. With `progress` (fit's validations): `on_validation_model_zero_grad` first, the values
    logged (with the progress bar's) and the position marked validated; without (the sanity
    check): nothing logged."""
    def validation() -> None:
        evaluated = evaluate(parts.trainer, run.module, run.compiled, run.built_from, parts.hooks, run.loaders.val,
                             step_lib.pieces.eval_params(run.state, pieces), run.state.model_state, run.state.rng,
                             stage="val", limit=limit, strategy=parts.strategy)
        if progress is not None:
            parts.metric_log.log(evaluated.values, aliases=evaluated.aliases, progress_bar=evaluated.progress_bar,
                                 pictures=evaluated.pictures)
            progress.last_validated = progress.position

    hooked(parts.hooks, parts.trainer, run.module, "validation", validation, zero_grad=progress is not None)


def hooked(hooks, trainer, module, hook: str, run: Callable[[], T], *, zero_grad: bool = False) -> T:
    """`run()` between Lightning's hooks of an evaluation (`hook`: "validation", "test" or
    "predict"): `on_<hook>_model_zero_grad` (fit's validations only), `on_<hook>_model_eval`,
    `on_<hook>_start` and `on_<hook>_epoch_start` before it; `on_<hook>_epoch_end`,
    `on_<hook>_end` and `on_<hook>_model_train` (not predict's: Lightning has none) after it."""
    for name in ("model_zero_grad",) * zero_grad + ("model_eval", "start", "epoch_start"):
        hooks.call(f"on_{hook}_{name}", trainer, module)
    result = run()
    for name in ("epoch_end", "end") + ("model_train",) * (hook != "predict"):
        hooks.call(f"on_{hook}_{name}", trainer, module)
    return result


def evaluate(trainer, module, compiled, built_from, hooks, loaders, params, model_state, rng, *, stage: str,
             limit: int | float | None, strategy) -> "Evaluated":
    """Loss and metrics over the whole of each loader (its first `limit` batches), each
    example counted once, with the per-batch hooks; with several loaders each key gets
    Lightning's `/dataloader_idx_<i>` suffix."""
    hook = {"val": "on_validation_batch_end", "test": "on_test_batch_end"}[stage]
    wants_batch_end = hooks.wants(hook, module)  # the module's or a callback's
    reads_outputs = hooks.reads_outputs(hook, module)
    start_hook = hook.replace("_end", "_start")
    wants_batch_start = hooks.wants(start_hook, module)
    several = len(loaders) > 1
    evaluated = Evaluated({}, {}, {})
    for dataloader_idx, loader in enumerate(loaders):
        # Lightning passes `dataloader_idx` to the batch hooks only with several loaders
        extra, which = ((dataloader_idx,), f" (loader {dataloader_idx})") if several else ((), "")
        evaluator = compiled.evaluator(stage, dataloader_idx)
        names, specs = evaluator.names, evaluator.log_specs
        # what the step returned and appended travels only where something reads it
        returning = (reads_outputs or bool(evaluator.appends)) and evaluator.returning is not None
        eval_step = evaluator.returning if returning else evaluator.step
        acc = strategy.put(acc_lib.zeros(names, host=True), strategy.replicated)
        batches = eval_batches(loader, stage, strategy, limit, with_mask=True)
        for batch_idx, (padded, mask, batch) in enumerate(batches):
            if wants_batch_start:
                hooks.call(start_hook, trainer, module, batch, batch_idx, *extra)
            try:
                # the index travels as an array: one program for every batch
                index = strategy.put(np.asarray(batch_idx, np.int32), strategy.replicated)
                acc, outputs, *returned = eval_step(params, model_state, rng, acc, padded, mask, index)
            except Exception as err:
                built_from.explain(err, padded, f"the {_DATA[stage]} data's batch {batch_idx}{which}")
                raise
            if returning:
                rows = {"padded_rows": mask.shape[0], "size": batch_size_of(batch)}
                _step_outputs.append_rows(module, returned[0]["appends"], **rows)
                if reads_outputs:
                    outputs = _step_outputs.eval_outputs(outputs, returned[0]["outputs"], **rows)
            if wants_batch_end:
                hooks.call(hook, trainer, module, outputs, batch, batch_idx, *extra)
        host = jax.device_get(acc)  # sync point: once per loader of an evaluation
        values, pictures = _logged.compute_with_pictures(host, specs, stage=stage, epoch=True)
        suffix = _logged.loader_suffix(dataloader_idx) if several else ""
        evaluated.values.update({k + suffix: v for k, v in values.items()})
        evaluated.aliases.update({k + suffix: v for k, v in _logged.plain_names(host, specs, epoch=True).items()})
        evaluated.progress_bar.update({k + suffix: v for k, v in _logged.for_progress_bar(values, specs).items()})
        evaluated.pictures.update({k + suffix: v for k, v in pictures.items()})
    return evaluated


def predict_batches(trainer, module, compiled, built_from, hooks, loader, variables, *, limit, strategy,
                    keep: bool = True) -> list:
    """Every predict batch's outputs on the host, with the per-batch hooks; `keep=False`: none
    is held (a writer callback streams them to disk), so a data set larger than host memory
    can be predicted."""
    params, model_state, rng = variables
    wants_batch_start = hooks.wants("on_predict_batch_start", module)  # the module's or a callback's
    wants_batch_end = hooks.wants("on_predict_batch_end", module)
    kept = []  # (outputs, real rows) of each batch
    for batch_idx, (padded, size, batch) in enumerate(eval_batches(loader, "predict", strategy, limit)):
        if wants_batch_start:
            hooks.call("on_predict_batch_start", trainer, module, batch, batch_idx)
        try:
            out = compiled.predict_step(params, model_state, rng, padded)
        except Exception as err:
            built_from.explain(err, padded, f"the predict data's batch {batch_idx}")
            raise
        if keep:
            kept.append((out, size))
        if wants_batch_end:  # Lightning's: the batch's own rows, not the padding
            hooks.call("on_predict_batch_end", trainer, module, _real_rows(out, batch_size_of(padded), size),
                       batch, batch_idx)
    # sync point: one transfer at the end (from every process with several)
    return gather_rows([out for out, _ in kept], [size for _, size in kept])


def build_for(module, loader, stage: str, *, strategy, seed: int, options, limit) -> tuple[tuple, Built]:
    """Sharded `(params, model_state, rng)` for evaluating `module` and the programs built
    from the first batch of `loader` (an unfitted Linen model is initialised)."""
    first = next(iter(eval_batches(loader, stage, strategy, limit, shard=False)), None)
    if first is None:
        raise ValueError(f"the {stage} data is empty: it yielded no batch.")
    _token_ids.check_batch(first[0], _token_ids.vocab_size(module), where=f"the first batch of the {_DATA[stage]} data")
    state, compiled = step_lib.build(module.step_spec(), strategy, first[0], seed=seed,
                                     purpose="predict" if stage == "predict" else "eval", options=options)
    variables = state.params, state.model_state, state.rng
    return variables, Built(module, compiled, checks.BuiltFrom.of(first[0], f"the first batch of the {_DATA[stage]} data"))


def load_weights(trainer, module, variables, ckpt_path, load_hooks) -> tuple:
    """`variables` with the weights of checkpoint `ckpt_path`, its load hooks called."""
    variables = (*checkpoint.restore_variables(ckpt_path, variables[:2]), variables[2])
    meta = checkpoint.read_meta(ckpt_path)
    _resume.call_load_hooks(trainer, module, meta, load_hooks)
    if jax.process_index() == 0:
        log.info(f"Loaded model weights from the checkpoint at {ckpt_path} {_resume.stood_at(meta)}")
    return variables


def with_weights(trainer, hooks: HostHooks, module, variables: tuple, stage: str, ckpt_path) -> tuple:
    """The variables built for an evaluation, with checkpoint `ckpt_path`'s weights (its load
    hooks called) or, without one, a warning when nobody fitted the module; the module holds
    them after (later stages see the same weights)."""
    if ckpt_path is not None:
        variables = load_weights(trainer, module, variables, ckpt_path, hooks.overriding("on_load_checkpoint"))
    else:
        warn_unfitted(module, stage)
    module_lib.set_variables(module, *variables[:2])
    return variables


def warn_unfitted(module, stage: str) -> None:
    """Warns that an evaluation stage runs a Linen model nobody fitted nor loaded."""
    if module_lib.is_unfitted_linen(module):
        warnings.warn(f"Trainer.{_METHOD[stage]}: {type(module).__name__} was never fitted nor loaded; "
                      "its weights are freshly initialised. Fit it first, pass ckpt_path=..., or "
                      "load one with LitModule.load_from_checkpoint.",
                      stacklevel=_user_frame())


def _user_frame() -> int:
    """The `stacklevel` of the first caller outside fitjax (the user's call of the stage)."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(_FITJAX):
        frame, level = frame.f_back, level + 1
    return level


def val_batch_counts(loaders, limit) -> list[int | None]:
    """`num_val_batches` for a validation of `loaders` (one count per loader, Lightning's list);
    None for a loader without a length."""
    return [checks.apply_limit(limit, maybe_len(loader), stage="val") for loader in loaders]


def eval_batches(loader, stage: str, strategy, limit, *, with_mask: bool = False, shard: bool = True
                 ) -> Iterator[tuple[Batch, Any, Batch]]:
    """Batches padded to one shape (the first batch's size, rounded up to a multiple of the
    device count): `(padded, mask, batch)` with `with_mask`, else `(padded, real_size, batch)`;
    `batch` is the batch as the loader yielded it (what the per-batch hooks get, as Lightning's).

    With several processes each pads its own slice, to the loader's `local_batch_size` when
    it has one: a process's slice of the last batch may be smaller or empty, and all must
    agree on the shape (the global padded batch is then the single-process one)."""
    limit = checks.apply_limit(limit, maybe_len(loader), stage=stage)
    shards = strategy.num_batch_shards // jax.process_count()  # this process's devices
    local = getattr(loader, "local_batch_size", None) if jax.process_count() > 1 else None
    full = None if local is None else math.ceil(local / shards) * shards
    for batch_idx, batch in enumerate(checked_batches(loader, stage=stage)):
        if limit is not None and batch_idx >= limit:
            break
        size = batch_size_of(batch)
        if full is None or size > full:
            full = math.ceil(size / shards) * shards
        padded, mask = pad_batch(batch, full)
        if shard:
            padded = strategy.shard_batch(padded)
            mask = strategy.shard_batch(mask) if with_mask else mask
        yield padded, (mask if with_mask else size), batch


def stage_loaders(module, data, datamodule, *, stage: str, method: str, several: bool = True) -> list:
    """The stage's loaders (several where `several`: a list, tuple or dict of them): passed,
    else the datamodule's, else the module's own; the module's `prepare_data()` and
    `setup(stage)` run first (Lightning's order)."""
    if datamodule is not None:
        checks.check_datamodule(method, datamodule)
        datamodule.prepare_data()
        datamodule.setup({"val": "validate"}.get(stage, stage))
        data = getattr(datamodule, f"{stage}_dataloader")()
    _arguments.prepare_module(module, {"val": "validate"}.get(stage, stage))
    if data is None:
        data = _arguments.module_loader(module, f"{stage}_dataloader")
    if data is None:
        raise ValueError(f"Trainer.{method} needs data (a loader or iterable of batches), datamodule=, "
                         f"or a `{stage}_dataloader()` method on {type(module).__name__}.")
    loaders = as_loaders(data, name="data") if several else [as_loader(data, name="data")]
    return [with_transfer_hooks(loader, module, i) for i, loader in enumerate(loaders)]


@dataclasses.dataclass(frozen=True)
class Evaluated:
    """An evaluation's values under their logged keys, the plain names Lightning adds to
    `callback_metrics` (see `_logged.plain_names`), the values a progress bar shows and the
    matrices drawn as pictures."""

    values: HostMetrics
    aliases: HostMetrics
    progress_bar: HostMetrics
    #: matrices metrics computed (a confusion matrix), for the loggers that draw them
    pictures: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)


def _real_rows(outputs: Any, padded_rows: int, size: int) -> Any:
    """A predict batch's outputs without the rows of its padding (the last batch's): each leaf
    with `padded_rows` rows keeps its first `size`. With several processes the outputs are
    the global batch (every process's padded slice), left as they are."""
    if size == padded_rows or jax.process_count() > 1:
        return outputs
    return jax.tree.map(lambda x: x[:size] if np.ndim(x) and np.shape(x)[0] == padded_rows else x, outputs)
