"""Several runs of one fit as one program: `Trainer(runs=8)` (seeds) or `Trainer(runs=[{"lr":
1e-3}, {"lr": 3e-3}])` (hyperparameters read through `self.hparams`), trained side by side by
one jitted step vmapped over a leading axis of the train state (see docs/guides/many_runs.md)."""

from fitjax.runs._axis import RunAxis, active_runs, member, run_suffix, stop_run
from fitjax.runs._orders import RunOrders
from fitjax.runs._results import RunResults
from fitjax.runs._runs import Runs
from fitjax.runs._stops import RunStops

__all__ = ["RunAxis", "RunOrders", "RunResults", "RunStops", "Runs", "active_runs", "member", "run_suffix", "stop_run"]
