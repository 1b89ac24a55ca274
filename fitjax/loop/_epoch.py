"""One train epoch's work beside the loop's outline (`Trainer._train_epoch`): its batches, each
step with its hooks, logs, validations and stop checks (`train_batches`), and its end
(`end_epoch`).

They are functions of the fit's run (`FitRun`: they step its train state) and of what the epoch
is given (`EpochParts`: the loop's position, metric log, hooks, configuration, stop request);
they never read or write the Trainer, which they only hand on to the hooks. What ends the
batches is returned (`Ended`) for the loop to act on: a signal's stop raises there, a stop
between two batches pauses the epoch there.

Host cost: the batch loop is the one place that runs per step. Whatever stays the same for the
epoch is asked once before it, and no step makes a call that is not needed (the tiny MLP's
step is ~70 µs of CPU; `tests/loop/test_host_cost.py` counts the calls).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Literal

from fitjax import module as module_lib
from fitjax import step as step_lib
from fitjax.loop import _schedule as schedule
from fitjax.loop import _step_outputs
from fitjax.loop._host_hooks import HostHooks, edited_params
from fitjax.loop._stop import StopRequest, agree, agree_at_epoch_end
from fitjax.loop.config import LoopConfig
from fitjax.loop.fit_run import FitRun
from fitjax.loop.metric_log import MetricLog
from fitjax.loop.progress import Progress, ProgressView

__all__ = ["Ended", "EpochParts", "end_epoch", "train_batches", "write_params"]

Ended = Literal["data", "end", "pause", "signal"]
"""Why an epoch's batches ended: "data" (its batches ran out, or the module's
`on_train_batch_start` returned -1), "end" (max_steps, or a stop obeyed at the epoch's last
batch: its end work follows), "pause" (a stop obeyed between two batches: no end work), "signal"
(an agreed signal stop, its reason in `StopRequest.signal`)."""


@dataclasses.dataclass(frozen=True)
class EpochParts:
    """What an epoch's work is given, the same for all of its steps.

    Attributes:
        trainer: handed on to the hooks as their first argument; never read here.
        hooks: the loop's one way to call a hook (`HostHooks`).
        progress: the loop's position, written here (`advance`).
        view: its read-only view, which the schedule reads.
        metric_log: the train values' log (the steps' values, the log windows, the epoch's means).
        config: the loop's configuration.
        stop: the stop request (`trainer.should_stop`).
        wrap_step: the profiler's wrapper of the step functions (themselves when it is off).
        detect_anomaly: check every step's values on the host (a sync per step).
        validate: runs a validation inside fit (the Trainer's, with its hooks).
    """

    trainer: Any
    hooks: HostHooks
    progress: Progress
    view: ProgressView
    metric_log: MetricLog
    config: LoopConfig
    stop: StopRequest
    wrap_step: Callable[[Callable], Callable]
    detect_anomaly: bool
    validate: Callable[[FitRun], None]


def write_params(run: FitRun) -> None:
    """The weights the module's hooks wrote with `update_params`, into the fit's state."""
    if edits := module_lib.take_params_edits(run.module):
        run.state = run.state.replace(params=edited_params(run.state.params, edits, type(run.module).__name__))


def train_batches(parts: EpochParts, run: FitRun, chunks: Iterable[step_lib.StepInputs], *, offset: int) -> Ended:
    """Steps `chunks` (the epoch's, from batch `offset`) with the per-batch hooks, the log
    windows, the validations that fall due and the stop checks; returns why they ended."""
    module, feed, hooks, trainer = run.module, run.feed, parts.hooks, parts.trainer
    wants_batch_start = hooks.wants("on_train_batch_start", module)  # the module's or a callback's
    wants_batch_end = hooks.wants("on_train_batch_end", module)
    module_batch_start = module_lib.overrides(module, "on_train_batch_start")
    module_batch_end = module_lib.overrides(module, "on_train_batch_end")
    batch_start = hooks.caller("on_train_batch_start", trainer, module)  # per step: the cheapest call
    batch_end = hooks.caller("on_train_batch_end", trainer, module)
    # the batch the hooks get: None when every hook that runs ignores it (fitjax's own)
    gives_batch = hooks.needs_batch("on_train_batch_start", module) or hooks.needs_batch("on_train_batch_end", module)
    compiled, wrap = run.compiled, parts.wrap_step
    block_step, train_step, tail_step = (wrap(compiled.block_step), wrap(compiled.train_step),
                                         wrap(compiled.train_tail_step))
    cost = compiled.train_step_cost  # counted on the program the loop runs (`StepCost`)
    to_record = cost is not None and not cost.recorded
    # What stays the same for the whole epoch is asked once here, not at every step (the tiny
    # MLP's step is ~70 µs of CPU: each question per step was ~0.5 µs of it).
    position, view, metric_log, request, config = parts.progress, parts.view, parts.metric_log, parts.stop, parts.config
    stopping, log_every, detect_anomaly = run.stopping, config.log_every_n_steps, parts.detect_anomaly
    validates = schedule.val_epoch_due(config, view, run.loaders.val)  # check_val_every_n_epoch
    has_max_steps = config.max_steps is not None
    batch_idx = offset - 1
    metric_log.restart_speed()  # it/s: the epoch's steps are timed from here
    for chunk in chunks:
        batch_idx += chunk.num_batches
        batch = feed.hook_batch(chunk) if gives_batch else None
        if wants_batch_start:
            batch_start(batch, batch_idx)
            write_params(run)
            # Lightning's: the module's hook returned -1, the rest of the epoch is skipped
            if module_batch_start and hooks.response == -1:
                break
        if chunk.on_device:
            step_fn = block_step
        else:
            step_fn = train_step if chunk.full else tail_step
        if to_record and (chunk.on_device or chunk.full):
            cost.record(compiled.block_step if chunk.on_device else compiled.train_step, run.state, chunk.inputs)
            to_record = False
        try:
            run.state, outputs = step_fn(run.state, chunk.inputs)  # async dispatch
        except Exception as err:
            explain_failure(run, err, chunk, batch_idx, epoch=position.epoch)
            raise
        returned = None  # what training_step returned, when a batch-end hook may read it
        if feed.options.hook_outputs:
            outputs, returned = _step_outputs.train_returned(outputs, chunk, feed.options.accumulate_grad_batches)
        metric_log.step_done(outputs)  # a reference: read only if `callback_metrics` is
        position.advance(batches=chunk.num_batches, steps=chunk.num_steps)
        metric_log.read_arrived()  # the log steps' values that have arrived
        if detect_anomaly:  # sync point: every step, a debugging mode
            outputs = step_lib.train.check_anomaly(outputs, global_step=position.global_step,
                                                   epoch=position.epoch, num_steps=chunk.num_steps)
        synced = view.crossed(log_every)
        if synced:
            run.state = metric_log.start_window(run.state, run.compiled.reset_metrics)  # no wait
        if wants_batch_end:
            batch_end(outputs if returned is None else _step_outputs.merged(outputs, returned), batch, batch_idx)
            if module_batch_end:  # the module's hook may have written weights
                write_params(run)
        # a signal's stop: every process after the same step (`_preemption`)
        if (reason := stopping.reached(position.global_step)) is not None:
            request.signalled(reason)
            return "signal"
        # compared at sync points, or asked on this process (no collective between them)
        stop = agree(request, synced=synced) if synced or request.requested else False
        # a stop between two batches validates nowhere: the epoch's validation is at its end
        ends_epoch = stop and schedule.epoch_exhausted(view)
        if validates and schedule.val_due(config, view, run.loaders.val, stop=ends_epoch, synced=synced,
                                          val_every=run.val_every, last_val_time=run.last_val_time):
            parts.validate(run)
            stop = agree(request, synced=True)
        if has_max_steps and schedule.max_steps_reached(config, view):
            return "end"  # the run's configured end: its epoch ends here (Lightning)
        if stop and schedule.can_stop_early(config, view):
            return "end" if schedule.epoch_exhausted(view) else "pause"
    if validates and run.val_every is None and not schedule.time_based(config):
        parts.validate(run)  # data without a length: at its end
    return "data"


def explain_failure(run: FitRun, err: Exception, chunk: step_lib.StepInputs, last: int, *, epoch: int) -> None:
    """Raises naming the train batch when it is shaped unlike the one the model was built from."""
    if chunk.on_device:  # batches of one block: shaped alike
        return
    inputs = chunk.inputs[0] if run.feed.options.accumulate_grad_batches > 1 else chunk.inputs  # not the mask
    first = last - chunk.num_batches + 1
    which = f"batch {last}" if first == last else f"batches {first}-{last}"
    run.built_from.explain(err, inputs, f"the train data's {which} (epoch {epoch})")


def end_epoch(parts: EpochParts, run: FitRun) -> None:
    """The epoch's means logged (no partial step row: Lightning's rows), `on_train_epoch_end`,
    and the stop request agreed (an epoch's end is a sync point).

    The loop waits here for the epoch's windows and means, so `on_train_epoch_end` sees them
    written, as in Lightning. Not waiting when no hook reads them was measured (`overhead.py
    --only spe`, `spe/wait`: 0.99x, the host already runs 3 windows ahead of the device) and
    made the it/s of an epoch caught up later wrong (the device's catch-up timed as a whole
    epoch), so every epoch's end waits."""
    metric_log = parts.metric_log
    run.state = metric_log.log_train_epoch(run.state, run.compiled.reset_metrics)
    parts.progress.epoch_end_done = True
    metric_log.finish_windows()
    parts.hooks.call("on_train_epoch_end", parts.trainer, run.module)
    write_params(run)
    agree_at_epoch_end(parts.stop, parts.config, parts.view)
