"""`Trainer.validate`, `test` and `predict`: the evaluation stages; and the validations that
fit runs (with its sanity check before training) on the same evaluation.

`EvalStages` is a part of `Trainer` (it reads the trainer's strategy, compiled steps, hooks and
logging); it lives here so that `trainer.py` reads as the fit loop's outline.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import warnings
from typing import Any, Iterator

import flax.linen as nn
import jax
import numpy as np

from fitjax import metrics as acc_lib
from fitjax import step as step_lib
from fitjax import _logged, checkpoint
from fitjax._typing import Batch, HostMetrics
from fitjax.data import DataModule, as_loader, as_loaders, batch_size_of, checked_batches, pad_batch
from fitjax.loop import _arguments
from fitjax.loop import _checks as checks
from fitjax.loop._checks import maybe_len
from fitjax.loop import _resume
from fitjax.loop import _schedule as schedule
from fitjax.module import LitModule, check_dataloader_idx
from fitjax.loop.stage import Stage, in_precision
from fitjax.strategies import gather_rows

__all__ = ["EvalStages", "Evaluated"]

log = logging.getLogger("fitjax")

_DATA = {"val": "validation", "test": "test", "predict": "predict"}  # the stage's data, in messages
_METHOD = {"val": "validate", "test": "test", "predict": "predict"}  # the Trainer method of each stage


class EvalStages:
    """The evaluation stages of `Trainer` (validate, test, predict) and fit's validations."""

    def validate(self, module: LitModule | None = None, data: Any = None, *, datamodule: DataModule | None = None,
                 ckpt_path: str | os.PathLike | None = None, verbose: bool = True,
                 model: LitModule | None = None, dataloaders: Any = None) -> list[HostMetrics]:
        """Evaluates `module` on `data`; returns `[{"val/loss": ..., "val/<metric>": ...}]`, with
        what the module's hooks logged during the validation (`on_validation_epoch_end`).

        `data` may be several loaders (a list, tuple or dict of them): Lightning's result, one
        dict per loader, each with its own `<key>/dataloader_idx_<i>` values and the values
        logged outside the steps. `ckpt_path` ("last", "best" or a checkpoint folder) evaluates
        those weights instead.
        `verbose=False`: the progress bar prints no results line (Lightning's `verbose`).
        Lightning's spellings work too (`model=`, `dataloaders=`, a datamodule as `data`, the
        module's own `val_dataloader()`); without a module, the last fit's from its best
        checkpoint.
        """
        return self._run_eval_stage(module, data, datamodule, ckpt_path, verbose, stage="val",
                                    model=model, dataloaders=dataloaders)

    def test(self, module: LitModule | None = None, data: Any = None, *, datamodule: DataModule | None = None,
             ckpt_path: str | os.PathLike | None = None, verbose: bool = True,
             model: LitModule | None = None, dataloaders: Any = None) -> list[HostMetrics]:
        """Evaluates `module` on `data`; returns `[{"test/loss": ..., "test/<metric>": ...}]`
        (one dict per loader, as `validate`).

        `verbose=False`: the progress bar prints no results line (Lightning's `verbose`).
        Lightning's spellings work as in `validate` (`test_dataloader()` on the module).
        """
        return self._run_eval_stage(module, data, datamodule, ckpt_path, verbose, stage="test",
                                    model=model, dataloaders=dataloaders)

    @in_precision
    def _run_eval_stage(self, module, data, datamodule, ckpt_path, verbose, *, stage: str,
                        model=None, dataloaders=None) -> list[HostMetrics]:
        name = {"val": "validate", "test": "test"}[stage]
        module, data, datamodule, ckpt_path = self._stage_arguments(name, module, model, data, dataloaders,
                                                                    datamodule, ckpt_path)
        if not isinstance(verbose, bool):
            raise TypeError(f"Trainer.{name}(verbose=...) takes True or False, got {verbose!r}.")
        with module._mode(False):  # Lightning's eval mode, for what the hooks run
            return self._eval_stage(module, data, datamodule, ckpt_path, verbose, stage=stage, name=name)

    def _eval_stage(self, module, data, datamodule, ckpt_path, verbose, *, stage: str, name: str):
        loaders = self._stage_loaders(module, data, datamodule, stage=stage, method=name)
        check_dataloader_idx(module, stage, several=len(loaders) > 1)
        ckpt_path = _resume.resolve_ckpt_path(self, ckpt_path, where=f"Trainer.{name}(ckpt_path=...)")
        hook = {"val": "validation", "test": "test"}[stage]
        before, self._stage = self._stage, Stage(name, verbose=verbose)
        self._hooks.call("setup", self, module, name)
        try:
            params, model_state, rng = self._eval_variables(module, loaders[0], stage, ckpt_path)
            if stage == "val":
                self._count_val_batches(loaders)
            earlier = dict(self._callback_metrics)
            self._call(f"on_{hook}_start", module)
            self._call(f"on_{hook}_epoch_start", module)
            evaluated = self._evaluate(module, loaders, params, model_state, rng, stage=stage)
            self._log(evaluated.values, aliases=evaluated.aliases)
            self._call(f"on_{hook}_epoch_end", module)
            self._call(f"on_{hook}_end", module)
            logged = {k: v for k, v in self._callback_metrics.items() if earlier.get(k) is not v}
        finally:
            self._hooks.call("teardown", self, module, name)
            self._stage = before
        for logger in self.loggers:
            logger.save()
        if len(loaders) == 1:
            return [logged]
        return [_logged.of_loader(logged, i) for i in range(len(loaders))]

    @in_precision
    def predict(self, module: LitModule | None = None, data: Any = None, *, datamodule: DataModule | None = None,
                ckpt_path: str | os.PathLike | None = None, model: LitModule | None = None,
                dataloaders: Any = None, return_predictions: bool | None = None) -> Any:
        """Runs `module.predict_step` over `data`; returns host (numpy) outputs concatenated in
        input order, every example exactly once (the padding of a last partial batch removed).
        With several processes, every process returns all of them (gathered from the others).

        Lightning's spellings work as in `validate` (`predict_dataloader()` on the module);
        `return_predictions=False` returns None."""
        module, data, datamodule, ckpt_path = self._stage_arguments("predict", module, model, data, dataloaders,
                                                                    datamodule, ckpt_path)
        with module._mode(False):  # Lightning's eval mode, for what the hooks run
            host = self._predict(module, data, datamodule, ckpt_path, keep=return_predictions is not False)
        if not host or return_predictions is False:
            return None
        return jax.tree.map(lambda *xs: np.concatenate(xs, axis=0), *host)

    def _predict(self, module, data, datamodule, ckpt_path, *, keep: bool = True) -> list:
        """Every batch's predictions on the host; `keep=False`: none is held (a writer callback
        streams them to disk), so a data set larger than host memory can be predicted."""
        loader = self._stage_loaders(module, data, datamodule, stage="predict", method="predict", several=False)[0]
        ckpt_path = _resume.resolve_ckpt_path(self, ckpt_path, where="Trainer.predict(ckpt_path=...)")
        before, self._stage = self._stage, Stage("predict")
        self._hooks.call("setup", self, module, "predict")
        try:
            params, model_state, rng = self._eval_variables(module, loader, "predict", ckpt_path)
            self._hooks.call("on_predict_start", self, module)
            wants_batch_start = (self._hooks.wants("on_predict_batch_start")
                                 or module._overrides("on_predict_batch_start"))
            wants_batch_end = self._hooks.wants("on_predict_batch_end")
            pieces = []
            for batch_idx, (padded, size, batch) in enumerate(self._eval_batches(loader, "predict")):
                if wants_batch_start:
                    self._hooks.call("on_predict_batch_start", self, module, batch, batch_idx)
                try:
                    out = self._compiled.predict_step(params, model_state, rng, padded)
                except Exception as err:
                    self._built_from.explain(err, padded, f"the predict data's batch {batch_idx}")
                    raise
                if keep:
                    pieces.append((out, size))
                if wants_batch_end:  # Lightning's: the batch's own rows, not the padding
                    self._hooks.call("on_predict_batch_end", self, module,
                                     _real_rows(out, batch_size_of(padded), size), batch, batch_idx)
            # sync point: one transfer at the end (from every process with several)
            host = gather_rows([out for out, _ in pieces], [size for _, size in pieces])
            self._hooks.call("on_predict_end", self, module)
        finally:
            self._hooks.call("teardown", self, module, "predict")
            self._stage = before
        return host

    def _validate_during_fit(self, module: LitModule, val_loaders) -> None:
        self._finish_train_window()  # callbacks of validation see every train value up to now
        with self.profiler.profile("[loop] validation"):
            self._validate_in_fit(module, val_loaders)

    def _validate_in_fit(self, module: LitModule, val_loaders) -> None:
        with module._mode(False):  # Lightning's eval mode during validation, train mode after it
            self._validation_run(module, val_loaders)

    def _validation_run(self, module: LitModule, val_loaders) -> None:
        self._count_val_batches(val_loaders)
        self._call("on_validation_start", module)
        self._call("on_validation_epoch_start", module)
        evaluated = self._evaluate(
            module, val_loaders, self._eval_params(), self.state.model_state, self.state.rng, stage="val"
        )
        self.progress_bar_metrics.update(evaluated.progress_bar)
        self._log(evaluated.values, aliases=evaluated.aliases)
        self._progress.last_validated = self._progress.position
        self._call("on_validation_epoch_end", module)
        self._call("on_validation_end", module)

    def _sanity_check(self, module: LitModule, val_loaders) -> None:
        """Lightning's sanity check: `num_sanity_val_steps` validation batches (of each loader)
        before training, with the validation hooks (`trainer.sanity_checking` is True); nothing
        is logged."""
        if not self.num_sanity_val_steps or not schedule.validation_enabled(self._config, val_loaders):
            return
        limit = None if self.num_sanity_val_steps == -1 else self.num_sanity_val_steps
        before, self._stage = self._stage, dataclasses.replace(self._stage, sanity_checking=True)
        mode = module._mode(False)  # Lightning's eval mode
        try:
            mode.__enter__()
            self._call("on_sanity_check_start", module)
            self._count_val_batches(val_loaders, limit=limit)
            self._call("on_validation_start", module, log=False)
            self._call("on_validation_epoch_start", module, log=False)
            self._evaluate(module, val_loaders, self._eval_params(), self.state.model_state, self.state.rng,
                           stage="val", limit=limit)
            self._call("on_validation_epoch_end", module, log=False)
            self._call("on_validation_end", module, log=False)
        finally:
            mode.__exit__(None, None, None)
            self._stage = before
        self._call("on_sanity_check_end", module)

    def _eval_variables(self, module: LitModule, loader, stage: str, ckpt_path=None):
        """Sharded `(params, model_state, rng)` for eval (from `ckpt_path` when given);
        initialises an unfitted Linen model."""
        if (ckpt_path is None and self._compiled is not None and self._module_for_compiled is module
                and self.state is not None):
            return self._eval_params(), self.state.model_state, self.state.rng
        first = next(iter(self._eval_batches(loader, stage, shard=False)), None)
        if first is None:
            raise ValueError(f"the {stage} data is empty: it yielded no batch.")
        state, self._compiled = step_lib.build(
            module.step_spec(), self.strategy, first[0], seed=self.seed,
            purpose="predict" if stage == "predict" else "eval", options=self.step_options,
        )
        variables = state.params, state.model_state, state.rng
        if ckpt_path is not None:
            variables = (*checkpoint.restore_variables(ckpt_path, variables[:2]), variables[2])
            meta = checkpoint.read_meta(ckpt_path)
            _resume.call_load_hooks(self, module, meta)
            if self.is_global_zero:
                log.info(f"Loaded model weights from the checkpoint at {ckpt_path} "
                                      f"{_resume.stood_at(meta)}")
        elif module.variables is None and isinstance(module._find_model(), nn.Module):
            warnings.warn(f"Trainer.{_METHOD[stage]}: {type(module).__name__} was never fitted nor loaded; "
                          "its weights are freshly initialised. Fit it first, pass ckpt_path=..., or "
                          "load one with LitModule.load_from_checkpoint.",
                          stacklevel=3 if stage == "predict" else 4)  # the user's call
        self._module_for_compiled = module
        self._built_from = checks.BuiltFrom.of(first[0], f"the first batch of the {_DATA[stage]} data")
        self.state = None
        module._set_variables(*variables[:2])  # later stages see the same (initialised) weights
        return variables

    def _evaluate(self, module, loaders, params, model_state, rng, *, stage: str, limit: int | None = None
                  ) -> Evaluated:
        """Loss and metrics over the whole of each loader (its first `limit` batches), each
        example counted once; with several loaders each key gets Lightning's
        `/dataloader_idx_<i>` suffix."""
        hook = {"val": "on_validation_batch_end", "test": "on_test_batch_end"}[stage]
        wants_batch_end = self._hooks.wants(hook)
        start_hook = hook.replace("_end", "_start")
        wants_batch_start = self._hooks.wants(start_hook) or module._overrides(start_hook)
        several = len(loaders) > 1
        evaluated = Evaluated({}, {}, {})
        for dataloader_idx, loader in enumerate(loaders):
            # Lightning passes `dataloader_idx` to the batch hooks only with several loaders
            extra, which = ((dataloader_idx,), f" (loader {dataloader_idx})") if several else ((), "")
            eval_step, names, specs = self._compiled.evaluator(stage, dataloader_idx)
            acc = jax.device_put(acc_lib.zeros(names), self.strategy.replicated)
            batches = self._eval_batches(loader, stage, with_mask=True, limit=limit)
            for batch_idx, (padded, mask, batch) in enumerate(batches):
                if wants_batch_start:
                    self._hooks.call(start_hook, self, module, batch, batch_idx, *extra)
                try:
                    acc, outputs = eval_step(params, model_state, rng, acc, padded, mask)
                except Exception as err:
                    self._built_from.explain(err, padded, f"the {_DATA[stage]} data's batch {batch_idx}{which}")
                    raise
                if wants_batch_end:
                    self._hooks.call(hook, self, module, outputs, batch, batch_idx, *extra)
            host = jax.device_get(acc)  # sync point: once per loader of an evaluation
            values = _logged.compute(host, specs, stage=stage, epoch=True)
            suffix = _logged.loader_suffix(dataloader_idx) if several else ""
            evaluated.values.update({k + suffix: v for k, v in values.items()})
            evaluated.aliases.update({k + suffix: v for k, v in _logged.plain_names(host, specs, epoch=True).items()})
            evaluated.progress_bar.update({k + suffix: v for k, v in _logged.for_progress_bar(values, specs).items()})
        return evaluated

    def _count_val_batches(self, loaders, *, limit: int | None = None) -> None:
        """`num_val_batches` (one count per loader, Lightning's list) for the validation about to
        run, set before its hooks (a progress bar draws its total at `on_validation_start`);
        None for a loader without a length."""
        self.num_val_batches = [checks.apply_limit(limit or self.limits["val"], maybe_len(loader), stage="val")
                                for loader in loaders]

    def _eval_batches(self, loader, stage: str, *, with_mask: bool = False, shard: bool = True,
                      limit: int | None = None) -> Iterator[tuple[Batch, Any, Batch]]:
        """Batches padded to one shape (the first batch's size, rounded up to a multiple of the
        device count): `(padded, mask, batch)` with `with_mask`, else `(padded, real_size, batch)`;
        `batch` is the batch as the loader yielded it (what the per-batch hooks get, as Lightning's).

        With several processes each pads its own slice, to the loader's `local_batch_size` when
        it has one: a process's slice of the last batch may be smaller or empty, and all must
        agree on the shape (the global padded batch is then the single-process one)."""
        limit = checks.apply_limit(limit or self.limits[stage], maybe_len(loader), stage=stage)
        shards = self.strategy.num_batch_shards // jax.process_count()  # this process's devices
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
                padded = self.strategy.shard_batch(padded)
                mask = self.strategy.shard_batch(mask) if with_mask else mask
            yield padded, (mask if with_mask else size), batch

    def _stage_arguments(self, method: str, module, model, data, dataloaders, datamodule, ckpt_path):
        """`(module, data, datamodule, ckpt_path)` from fitjax's or Lightning's spellings."""
        module = _arguments.either(method, "module", module, "model", model)
        data = _arguments.either(method, "data", data, "dataloaders", dataloaders)
        if _arguments.is_datamodule(data) and datamodule is None:
            datamodule, data = data, None
        module, ckpt_path = _arguments.stage_module(self, method, module, ckpt_path)
        checks.check_module(module, method)
        self._lightning_module = module
        module.trainer = self
        return module, data, datamodule, ckpt_path

    def _stage_loaders(self, module, data, datamodule, *, stage: str, method: str, several: bool = True) -> list:
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
        return as_loaders(data, name="data") if several else [as_loader(data, name="data")]


@dataclasses.dataclass(frozen=True)
class Evaluated:
    """An evaluation's values under their logged keys, the plain names Lightning adds to
    `callback_metrics` (see `_logged.plain_names`) and the values a progress bar shows."""

    values: HostMetrics
    aliases: HostMetrics
    progress_bar: HostMetrics


def _real_rows(outputs: Any, padded_rows: int, size: int) -> Any:
    """A predict batch's outputs without the rows of its padding (the last batch's): each leaf
    with `padded_rows` rows keeps its first `size`. With several processes the outputs are
    the global batch (every process's padded slice), left as they are."""
    if size == padded_rows or jax.process_count() > 1:
        return outputs
    return jax.tree.map(lambda x: x[:size] if np.ndim(x) and np.shape(x)[0] == padded_rows else x, outputs)
