"""The loop: `Trainer`, the progress object it owns (`Progress`, read by callbacks through
`ProgressView`) and the `Stage` hooks read (`trainer.stage`).

`trainer.py` holds the public surface and `fit`'s outline; its parts, each built with what it
needs and returning values:

    config.LoopConfig     the loop's arguments, checked once and frozen (`self._config`), read
                          through the Lightning-named attributes (`_checks`, `_arguments`)
    progress.Progress     the loop's one position (`trainer.progress`: its read-only view)
    _schedule             functions of (configuration, progress): when training ends, a stop is
                          obeyed, validation is due
    _epoch                an epoch's batches (each step with its hooks, logs, validations and
                          stop checks) and its end work, on the `FitRun` and `EpochParts`
    _stop.StopRequest     `should_stop` and the last signal stop; `_stop` agrees on a request
                          and pauses an epoch a stop cut short
    fit_run.FitRun        what one fit holds (module, loaders, feed, train state, compiled
                          programs, validation counters, stop agreement); dies with the fit
    fit_run.Built         what fit/validate/test/predict built for a module, kept for the next call
    train_feed.TrainFeed  an epoch's batches and chunks (on the devices or prefetched), the
                          loader's positions, each accumulation count's steps (`fit_loaders`)
    metric_log.MetricLog  `callback_metrics`, `logged_metrics`, `progress_bar_metrics`, the
                          train log windows and the epoch's means; the loop says when to fetch
    evaluation            what validate, test, predict and fit's validations run, with their
                          hooks and logs, on the `EvalParts` they are given
    _resume               what a checkpoint records (`ResumePoint.to_meta/from_meta`) and a
                          fit's restore from one (`resume_fit`)
    _preemption           the signals that stop a fit, the hpc checkpoint, the requeue
    _pieces.PieceRunner   the state pieces' epoch-start and end-of-training work
    generation            `Trainer.generate`'s run, over its options (`fitjax.GenerationOptions`), the
                          prompts' host side (`_prompts`) and the programs on the devices (`_decode`)
"""

from fitjax.loop.progress import Position, Progress, ProgressView
from fitjax.loop.stage import Stage
from fitjax.loop.trainer import Trainer

# For the CLI and `fitjax launch`, not part of the user-facing API: `--ckpt_path` resolved as
# `fit(ckpt_path=)` does, and the variable a restarted process finds its restart count in.
from fitjax.loop._interrupt import DEBUG_VAR, Interrupted, exit_quietly_on_ctrl_c
from fitjax.loop._preemption import RESTART_COUNT_VAR
from fitjax.loop._resume import resolve_ckpt_path

__all__ = ["Position", "Progress", "ProgressView", "Stage", "Trainer"]
