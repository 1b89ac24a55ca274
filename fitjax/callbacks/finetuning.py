"""`BaseFinetuning` / `BackboneFinetuning`: freeze parameter groups and unfreeze them at an epoch."""

from __future__ import annotations

import logging
from typing import Callable, Sequence

from fitjax.callbacks._base import Callback
from fitjax.step import learning_rate as lr_lib
from fitjax.step.pieces import FinetuningScales

__all__ = ["BackboneFinetuning", "BaseFinetuning"]

log = logging.getLogger("fitjax")


def _keys(modules, where: str) -> tuple[str, ...]:
    keys = (modules,) if isinstance(modules, str) else tuple(modules)
    if not keys or any(not isinstance(k, str) or not k for k in keys):
        raise TypeError(f"{where}: `modules` must be a top-level parameter key (str) or a list of them, e.g. "
                        f"'backbone' for the submodule `self.backbone`; got {modules!r}.")
    return keys


class FinetuningOptimizer:
    """What `finetune_function` receives as `optimizer`: torch-like `param_groups`, each a dict
    with `"lr"` (a host float) and `"params"` (the top-level parameter keys it holds; group 0 holds
    every key not added to another). Group 0's rate is the optimizer's base rate; a group's
    updates are scaled by its rate over it."""

    def __init__(self, base_lr: float):
        self.param_groups: list[dict] = [{"lr": base_lr, "params": []}]


class BaseFinetuning(Callback):
    """Freezes parameter groups before training and unfreezes them at chosen epochs (Lightning's).

    Subclass it and override `freeze_before_training(pl_module)` (call `self.freeze(...)`) and
    `finetune_function(pl_module, epoch, optimizer)` (call `self.unfreeze_and_add_param_group(...)`
    at the epoch of your choice), as in Lightning. A "module" here is a top-level key of the
    module's parameters, the name of a submodule (`"backbone"` for `self.backbone = ...` in a
    Linen `setup`), or a list of them.

    How it runs in JAX: when fit starts the two hooks are run on the host for every epoch up to
    `max_epochs` (1000 when unlimited; later epochs repeat the last), giving a table of per-group
    update scales (0: frozen, else the group's rate over group 0's); the train step reads the
    epoch's scales from its state (set at each epoch start by one function compiled once), so
    unfreezing recompiles nothing and a resumed run continues exactly. A frozen group's gradient
    is zeroed before clipping (as torch has none for it), its update is 0 and its optimizer state
    entries (moments) stay as they were; with `train_bn=False` its model state (BatchNorm
    statistics) is kept too (the forward still uses batch statistics: JAX has no per-module
    eval mode). The hooks must therefore depend only on the epoch and on the optimizer's
    `param_groups` (not on metrics); group 0's `"lr"` is the base rate when fit starts (the
    injected or scheduled rate at step 0, 1.0 when it cannot be read), not a scheduler's later
    value. Exact versus Lightning for SGD with a constant base rate; with Adam the groups share
    one step count (optax), so a group unfrozen later gets bias corrections of the later step.

    Args:
        name: its key in `trainer.state.extras` (the scales of the current epoch).
        verbose: log each epoch's update scales at its start.
    """

    def __init__(self, name: str = "finetuning", verbose: bool = False):
        self.name, self.verbose = name, bool(verbose)
        self._groups: tuple[str, ...] = ()
        self._piece = FinetuningScales(name)
        self._frozen: set[str] = set()
        self._keep_stats: set[str] = set()
        self._optimizer: FinetuningOptimizer | None = None
        self.table: list[dict[str, float]] = []

    # Lightning's hooks
    def freeze_before_training(self, pl_module) -> None:
        """Override: freeze groups before training (`self.freeze("backbone")`)."""
        raise NotImplementedError("BaseFinetuning subclasses override freeze_before_training(pl_module).")

    def finetune_function(self, pl_module, epoch: int, optimizer: FinetuningOptimizer) -> None:
        """Override: at the start of (0-based) epoch `epoch`, unfreeze groups
        (`self.unfreeze_and_add_param_group("backbone", optimizer)`)."""
        raise NotImplementedError("BaseFinetuning subclasses override finetune_function(pl_module, epoch, optimizer).")

    # Lightning's methods
    def freeze(self, modules, train_bn: bool = True) -> None:
        """Freeze these top-level parameter groups (no update, no optimizer state change); with
        `train_bn=False` their model state (BatchNorm statistics) stays as it is too."""
        for key in _keys(modules, "BaseFinetuning.freeze"):
            self._frozen.add(key)
            (self._keep_stats.discard if train_bn else self._keep_stats.add)(key)
            for group in (self._optimizer.param_groups if self._optimizer else []):
                if key in group["params"]:
                    group["params"].remove(key)

    def make_trainable(self, modules) -> None:
        """Unfreeze these groups at the base rate (they stay in group 0)."""
        for key in _keys(modules, "BaseFinetuning.make_trainable"):
            self._frozen.discard(key)
            self._keep_stats.discard(key)

    def unfreeze_and_add_param_group(self, modules, optimizer: FinetuningOptimizer, lr: float | None = None,
                                     initial_denom_lr: float = 10.0, train_bn: bool = True) -> None:
        """Unfreeze these groups with their own rate `lr` (default: group 0's rate divided by
        `initial_denom_lr`), as a new `optimizer.param_groups` entry."""
        keys = _keys(modules, "BaseFinetuning.unfreeze_and_add_param_group")
        if initial_denom_lr <= 0:
            raise ValueError(f"unfreeze_and_add_param_group(initial_denom_lr=...) must be > 0, "
                             f"got {initial_denom_lr!r}.")
        self.make_trainable(keys)
        if not train_bn:
            self._keep_stats.update(keys)
        base = optimizer.param_groups[0]["lr"]
        optimizer.param_groups.append({"lr": base / initial_denom_lr if lr is None else float(lr),
                                       "params": list(keys)})

    # the JAX side
    def step_pieces(self) -> tuple[FinetuningScales]:
        return (self._piece,)

    def on_fit_start(self, trainer, module) -> None:
        params = trainer.state.params
        self._groups = tuple(params) if isinstance(params, dict) else ()
        base = _base_lr(trainer, module)
        epochs = trainer.max_epochs if isinstance(trainer.max_epochs, int) and trainer.max_epochs > 0 else 1000
        table, stats = self.build_table(module, 1.0 if base is None else base, epochs)
        unknown = (self._frozen | self._keep_stats) - set(self._groups)
        for group in self._optimizer.param_groups[1:]:
            unknown |= set(group["params"]) - set(self._groups)
        if unknown:
            raise ValueError(f"{type(self).__name__}: {sorted(unknown)} are not top-level keys of the module's "
                             f"parameters {sorted(self._groups)}; name a submodule (e.g. 'backbone' for "
                             "`self.backbone`).")
        self._piece.table = [[row[g] for g in self._piece.groups] for row in table]
        self._piece.keep_stats = [[row[g] for g in self._piece.groups] for row in stats]

    def on_train_epoch_start(self, trainer, module) -> None:
        if self.verbose:
            row = self.table[min(trainer.current_epoch, len(self.table) - 1)]
            log.info("%s epoch %d: update scales %s", type(self).__name__, trainer.current_epoch, row)

    @property
    def state_key(self) -> str:
        return f"{type(self).__name__}[{self.name}]"

    def _row(self) -> dict[str, float]:
        base = self._optimizer.param_groups[0]["lr"]
        row = {}
        for key in self._groups:
            rate = base
            for group in self._optimizer.param_groups[1:]:
                if key in group["params"]:
                    rate = group["lr"]
            row[key] = 0.0 if key in self._frozen else (rate / base if base else 1.0)
        return row

    def build_table(self, module, base_lr: float, epochs: int) -> list[dict[str, float]]:
        """Run the hooks on the host for epochs `0 .. epochs-1`: each epoch's `{group: scale}`."""
        self._frozen, self._keep_stats = set(), set()
        self._optimizer = FinetuningOptimizer(base_lr)
        self.freeze_before_training(module)
        table, stats = [], []
        for epoch in range(epochs):
            self.finetune_function(module, epoch, self._optimizer)
            table.append(self._row())
            stats.append({k: k in self._keep_stats and k in self._frozen for k in self._groups})
        self.table = table
        return table, stats


def _base_lr(trainer, module) -> float | None:
    opt_state = trainer.state.opt_state
    if lr_lib.count(opt_state) == 1:
        return lr_lib.host_values(opt_state)[0]
    schedule = lr_lib.schedule_of(module)
    return None if schedule is None else float(schedule(0))


class BackboneFinetuning(BaseFinetuning):
    """Freezes the `backbone` group, then unfreezes it at an epoch with a growing rate (Lightning's).

    The backbone is the top-level parameter key `"backbone"` (a submodule assigned as
    `self.backbone` in a Linen module's `setup`, or `backbone=` of `nn.compact`), where Lightning
    uses `pl_module.backbone`. At (0-based) epoch `unfreeze_backbone_at_epoch` it trains at
    `backbone_initial_lr` (default `backbone_initial_ratio_lr` times the base rate); each later
    epoch `e` multiplies its rate by `lambda_func(e + 1)`, capped at the base rate with
    `should_align`. See `BaseFinetuning` for how this runs (one compile, exact resume) and where it
    differs from torch.

    Args:
        unfreeze_backbone_at_epoch: the first epoch the backbone trains.
        lambda_func: `epoch -> factor` (default 2.0, Lightning's `multiplicative`).
        backbone_initial_ratio_lr: the backbone's first rate over the base rate.
        backbone_initial_lr: the backbone's first rate, absolute (needs a readable base rate).
        should_align: cap the backbone's rate at the base rate.
        initial_denom_lr: unused with the rate given (Lightning's argument, kept for porting).
        train_bn: whether the backbone's BatchNorm statistics update while frozen.
        verbose: log "Current lr: ..., Backbone lr: ..." at each epoch start from the unfreeze on.
        rounding: digits of the logged rates.

    Example:
        >>> import fitjax as fj
        >>> trainer = fj.Trainer(max_epochs=20, callbacks=[fj.BackboneFinetuning(unfreeze_backbone_at_epoch=10)])
    """

    def __init__(self, unfreeze_backbone_at_epoch: int = 10, lambda_func: Callable[[int], float] | None = None,
                 backbone_initial_ratio_lr: float = 0.1, backbone_initial_lr: float | None = None,
                 should_align: bool = True, initial_denom_lr: float = 10.0, train_bn: bool = True,
                 verbose: bool = False, rounding: int = 12, name: str = "finetuning"):
        if isinstance(unfreeze_backbone_at_epoch, bool) or not isinstance(unfreeze_backbone_at_epoch, int) \
                or unfreeze_backbone_at_epoch < 0:
            raise ValueError("BackboneFinetuning(unfreeze_backbone_at_epoch=...) must be an int >= 0 (0-based), "
                             f"got {unfreeze_backbone_at_epoch!r}.")
        if lambda_func is not None and not callable(lambda_func):
            raise TypeError(f"BackboneFinetuning(lambda_func=...) must be a function epoch -> factor, "
                            f"got {lambda_func!r}.")
        if not backbone_initial_ratio_lr > 0 or (backbone_initial_lr is not None and not backbone_initial_lr > 0):
            raise ValueError("BackboneFinetuning: backbone_initial_ratio_lr and backbone_initial_lr must be > 0, got "
                             f"{backbone_initial_ratio_lr!r} and {backbone_initial_lr!r}.")
        super().__init__(name=name)
        self.unfreeze_backbone_at_epoch = unfreeze_backbone_at_epoch
        self.lambda_func = lambda_func or (lambda epoch: 2.0)
        self.backbone_initial_ratio_lr = float(backbone_initial_ratio_lr)
        self.backbone_initial_lr = backbone_initial_lr
        self.should_align, self.initial_denom_lr = bool(should_align), float(initial_denom_lr)
        self.train_bn, self.verbose, self.rounding = bool(train_bn), bool(verbose), int(rounding)
        self.previous_backbone_lr: float | None = None

    def on_fit_start(self, trainer, module) -> None:
        if self.backbone_initial_lr is not None and _base_lr(trainer, module) is None:
            raise ValueError("BackboneFinetuning(backbone_initial_lr=...) needs the base rate: use "
                             "optax.inject_hyperparams or a learning_rate schedule, or give backbone_initial_ratio_lr.")
        super().on_fit_start(trainer, module)

    def on_train_epoch_start(self, trainer, module) -> None:
        # Lightning's line from the unfreeze epoch on (rates relative to 1.0 when the base rate is unknown)
        if self.verbose and trainer.current_epoch >= self.unfreeze_backbone_at_epoch:
            row = self.table[min(trainer.current_epoch, len(self.table) - 1)]
            base = self._optimizer.param_groups[0]["lr"]
            log.info("Current lr: %s, Backbone lr: %s", round(base, self.rounding),
                     round(base * row["backbone"], self.rounding))

    def freeze_before_training(self, pl_module) -> None:
        self.previous_backbone_lr = None
        self.freeze("backbone", train_bn=self.train_bn)

    def finetune_function(self, pl_module, epoch: int, optimizer: FinetuningOptimizer) -> None:
        current = optimizer.param_groups[0]["lr"]
        if epoch == self.unfreeze_backbone_at_epoch:
            initial = self.backbone_initial_lr or current * self.backbone_initial_ratio_lr
            self.previous_backbone_lr = initial
            self.unfreeze_and_add_param_group("backbone", optimizer, initial, train_bn=self.train_bn,
                                              initial_denom_lr=self.initial_denom_lr)
        elif epoch > self.unfreeze_backbone_at_epoch:
            following = self.lambda_func(epoch + 1) * self.previous_backbone_lr
            following = min(current, following) if self.should_align else following
            optimizer.param_groups[-1]["lr"] = following
            self.previous_backbone_lr = following
