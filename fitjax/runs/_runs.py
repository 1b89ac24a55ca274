"""`Runs`: the checked `Trainer(runs=...)` argument, and the build of a fit of several runs.

`Trainer(runs=8)` trains 8 runs that differ by seed (run i: `seed + i`); `Trainer(runs=[{"lr":
1e-3}, {"lr": 3e-3}])` runs that differ by the hyperparameters the module reads through
`self.hparams` (each from `seed`, unless its dict has a "seed"). Options that do not compose
with runs yet are refused here, naming the option, before anything is built.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any, Mapping, Sequence

import jax

from fitjax import step as step_lib
from fitjax.data import DataLoader
from fitjax.step import xla_cpu
from fitjax.runs._axis import RunAxis
from fitjax.runs._orders import RunOrders
from fitjax.strategies import DataParallel, RunsParallel, SingleDevice, Strategy

__all__ = ["Runs"]


@dataclasses.dataclass(frozen=True)
class Runs:
    """The runs of a fit: each one's seed and hyperparameters (None: they differ by seed only)."""

    seeds: tuple[int, ...]
    hparams: tuple[dict[str, Any], ...] | None = None

    @property
    def size(self) -> int:
        return len(self.seeds)

    @property
    def names(self) -> tuple[str, ...]:
        """Each run's name: what differs, `seed=3` or `lr=0.003,wd=0.1` (a `#i` added to repeats)."""
        if self.hparams is None:
            names = [f"seed={s}" for s in self.seeds]
        else:
            keys = [k for k in self.hparams[0] if len({repr(h[k]) for h in self.hparams}) > 1]
            if len(set(self.seeds)) > 1:
                keys = ["seed", *keys]
            rows = [{"seed": s, **h} for s, h in zip(self.seeds, self.hparams)]
            names = [",".join(f"{k}={_short(r[k])}" for k in keys) or "run" for r in rows]
        return tuple(name if names.count(name) == 1 else f"{name}#{i}" for i, name in enumerate(names))

    @property
    def run_hparams(self) -> tuple[dict[str, Any], ...]:
        """What each run sets: its seed and hyperparameters (its HPARAMS session's values)."""
        return tuple({"seed": s, **(self.hparams[i] if self.hparams else {})} for i, s in enumerate(self.seeds))

    def to_meta(self) -> dict[str, Any]:
        """What a checkpoint of every run records of them (JSON): each one's seed,
        hyperparameters (what it sets over the module's) and name."""
        return {"seeds": list(self.seeds), "hparams": [dict(h) for h in self.hparams or [{}] * self.size],
                "names": list(self.names)}

    @classmethod
    def create(cls, runs: Any, *, seed: int) -> "Runs | None":
        """Checks `Trainer(runs=...)`: None, a count of seeds, or a list of hyperparameter dicts."""
        if runs is None:
            return None
        if isinstance(runs, numbers.Integral) and not isinstance(runs, bool):
            if runs < 1:
                raise ValueError(f"Trainer(runs=...) must be at least 1, got {runs!r}.")
            return cls(tuple(seed + i for i in range(int(runs))))
        if isinstance(runs, (str, bytes, Mapping)) or not isinstance(runs, Sequence) or not runs:
            raise TypeError(
                f"Trainer(runs=...) takes a number of runs (`runs=5`: seeds seed, seed+1, ...) or a "
                f"non-empty list of hyperparameter dicts (`runs=[{{'lr': 1e-3}}, {{'lr': 3e-3}}]`), got {runs!r}.")
        seeds, hparams = [], []
        for i, run in enumerate(runs):
            if not isinstance(run, Mapping) or not all(isinstance(k, str) for k in run):
                raise TypeError(f"Trainer(runs=[...]): runs[{i}] must be a dict of hyperparameters "
                                f"(names -> values), got {run!r}.")
            run = dict(run)
            run_seed = run.pop("seed", seed)
            if not isinstance(run_seed, numbers.Integral) or isinstance(run_seed, bool):
                raise TypeError(f"Trainer(runs=[...]): runs[{i}]['seed'] must be an int, got {run_seed!r}.")
            if hparams and set(run) != set(hparams[0]):
                raise ValueError(f"Trainer(runs=[...]): every run must set the same hyperparameters; runs[0] "
                                 f"sets {sorted(hparams[0])}, runs[{i}] sets {sorted(run)}.")
            seeds.append(int(run_seed))
            hparams.append(run)
        for key in hparams[0]:
            values = [h[key] for h in hparams]
            if len({repr(v) for v in values}) > 1 and not all(_is_number(v) for v in values):
                raise ValueError(
                    f"Trainer(runs=[...]): {key!r} differs between runs ({values!r}); only numbers may "
                    "differ (each run's is a traced array). Fit one module per value of "
                    f"{key!r} instead.")
        return cls(tuple(seeds), tuple(hparams))

    def check_options(self, strategy: Strategy, options: step_lib.StepOptions) -> None:
        """Raises naming the first Trainer option that does not compose with runs yet."""
        if not isinstance(strategy, (SingleDevice, DataParallel, RunsParallel)):
            raise ValueError(
                f"Trainer(runs=..., strategy={type(strategy).__name__}): several runs in one program "
                "work with strategy='single', 'dp' (the runs' axis replicated, the batch split) or 'runs' "
                "(the runs split over the devices, the batch whole); sharding the state (fsdp) is not "
                "supported with runs yet.")
        refused = {
            "precision='16-mixed'": options.precision.initial_loss_scale() is not None,
            "detect_anomaly=True": options.detect_anomaly,
            "remat": options.remat != "none",
            "update_in_backward=True": options.update_in_backward,
        }
        for option, on in refused.items():
            if on:
                raise ValueError(f"Trainer(runs=..., {option}) is not supported yet: drop {option.split('=')[0]} "
                                 "or fit the runs one at a time.")
        if options.pieces:
            names = sorted(p.name for p in options.pieces)
            raise ValueError(
                f"Trainer(runs=...) with callbacks that change the train step ({names}: EMA, "
                "StochasticWeightAveraging, BaseFinetuning, SpikeDetection, ...) is not supported yet: "
                "drop those callbacks or fit the runs one at a time.")

    def axis(self, module: Any, spec: step_lib.ModuleSpec, strategy: Strategy | None = None) -> RunAxis:
        """The runs of a fit of `module` (whose `step_spec()` is `spec`): its hyperparameters must have
        every name the runs set; vmapped as `strategy`'s platform does best (`xla_cpu.runs_vmap`;
        None: `jax.vmap`)."""
        owner = type(module).__name__
        if spec.weights is not None:
            raise ValueError(f"Trainer(runs=...) with {owner}.load_weights(...) or .load_adapters(...) is not "
                             "supported yet: start the runs from the module's own initialisation.")
        saved = dict(module.hparams)
        for i, run in enumerate(self.hparams or ()):
            unknown = sorted(set(run) - set(saved))
            if unknown:
                raise ValueError(
                    f"Trainer(runs=[...]): runs[{i}] sets {unknown}, which {owner}'s hparams do not have "
                    f"(saved: {sorted(saved)}). Make them __init__ arguments recorded by "
                    "`self.save_hyperparameters()`, and read them through `self.hparams`.")
        vmap = jax.vmap if strategy is None else xla_cpu.runs_vmap(
            platform=strategy.platform, sharded=isinstance(strategy, RunsParallel))
        return RunAxis(self.seeds, self.hparams, owner, vmap=vmap, module_type=type(module))

    def train_loader(self, loader: Any) -> Any:
        """The train loader the runs read: `RunOrders` for a `DataLoader(shuffle="per_run")`
        (each run its own order), else `loader` (every run the same batches)."""
        if isinstance(loader, DataLoader) and loader.shuffle_per_run and not isinstance(loader, RunOrders):
            return RunOrders(loader, self.size)
        return loader

    def build(self, module: Any, strategy: Strategy, batch: Any, *, options: step_lib.StepOptions,
              per_run_data: bool = False) -> step_lib.StepBuild:
        """The state of every run, stacked, and the programs that train them together;
        `per_run_data`: `batch` holds each run's rows (`RunOrders`), run 0's build the programs
        (every run's state starts from its seed alone, whatever its first rows)."""
        spec = module.step_spec()
        axis = self.axis(module, spec, strategy)
        if spec.variables is not None and not axis.differing:
            # every run would start from the same weights: they would differ by random streams alone
            raise ValueError(
                f"Trainer(runs={self.size}) with {axis.owner}, whose model already holds weights (an NNX "
                "model makes them in `__init__`; a Linen model after a fit or a load): every run would "
                "start from those same weights, so runs that differ by seed alone would train alike (only "
                "dropout's draws differ). Use a Linen model (initialised for each run from its own seed), "
                "or sweep hyperparameters (`runs=[{'lr': 1e-3}, {'lr': 3e-3}]`: every run then starts "
                "from the model's weights).")
        spec = axis.spec(spec)
        if per_run_data:
            batch = jax.tree.map(lambda x: x[:, 0], batch)
        axis.batch, axis.per_run_data = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), batch), per_run_data
        return step_lib.build(spec, strategy, batch, seed=self.seeds[0], options=options, runs=axis)


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Number) and not isinstance(value, complex)


def _short(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)
