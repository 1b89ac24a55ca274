"""State pieces: something a callback adds around the train step, with state of its own.

A `StatePiece` owns one entry of `TrainState.extras` (keyed by its `name`): `init(params)` makes
it when the state is built, and `update(extra, params, step)` runs inside the jitted train step
after each optimizer update, so it costs no host work and no extra dispatch. Its state is part of
the one state pytree: sharded like the parameters it mirrors (a leaf whose path ends with a
parameter's path gets that parameter's sharding), donated with the state, checkpointed with it
and restored bitwise on resume.

How a callback contributes one: override `Callback.step_pieces()` to return pieces; the trainer
asks every callback once, when it is constructed, and builds its step with them. A piece may also
stand in for the parameters: `use_for_eval` (validation, test and predict read
`eval_params(state)`) and `use_for_module` (`module.variables` after fit holds them).

Beyond the per-step `update`, a piece may (each optional, each costing nothing when unused):
- `epoch_start(extra, params, opt_state, epoch)`: run by the loop at the start of every train
  epoch (not again when a resumed run continues an epoch mid-way), through one jitted function
  compiled once (the epoch is an array), with the state's shardings;
- `learning_rate(extra)`: impose the learning rate of each update (a traced scalar, NaN: the
  optimizer's own; see `fitjax.step.learning_rate`);
- `guard(extra, loss, step)`: judge each optimizer step's loss before its update is kept: it
  returns the piece's new state and whether to keep the update (a traced bool); a step not kept
  leaves the parameters, optimizer state and model state as they were (`SpikeGuard`);
- `group_scales(extra)`: scale each top-level parameter group's update (dicts `{key: traced
  scalar}`; 0 = frozen: its gradient is zeroed before clipping, its update is 0 and its optimizer
  and model state entries stay as they were; `FinetuningScales`);
- `ends_training(epochs_done)` / `final_params(extra, params)`: replace the parameters when
  training ends, and with `recompute_model_state` have the loop recompute the model state
  (BatchNorm statistics) with one pass over the train data (`fitjax.step.running_stats`).
"""

from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp

from fitjax._typing import PyTree
from fitjax.state import TrainState
from fitjax.step import learning_rate as lr_lib

__all__ = ["ExponentialMovingAverage", "FinetuningScales", "SpikeGuard", "StatePiece", "StochasticAverage",
           "check_pieces", "epoch_start", "eval_params", "eval_params_key", "group_scales", "guard", "init_extras",
           "keep_frozen", "learning_rate", "module_params", "scale_groups", "update_extras"]


class StatePiece:
    """Abstract: one piece around the train step holding `TrainState.extras[name]`.

    Attributes:
        name: its key in `TrainState.extras` (unique among a trainer's pieces).
        use_for_eval: validation, test and predict use `params_of(extra)` instead of the params;
            so do `validate/test/predict(ckpt_path=...)` and `load_from_checkpoint` on a
            checkpoint saved with it (as Lightning's `WeightAveraging` saves the average as the
            model's weights).
        use_for_module: `module.variables` after fit holds `params_of(extra)`.
        params_key: where in the piece's state its parameters are (`params_of`); () when the
            state is the parameters.
    """

    name: str = ""
    use_for_eval: bool = False
    use_for_module: bool = False
    params_key: tuple[str, ...] = ()
    recompute_model_state: bool = False  # after `final_params` replaced the parameters

    def init(self, params: PyTree) -> PyTree:
        """The piece's initial state from the initial parameters (traced)."""
        raise NotImplementedError

    def update(self, extra: PyTree, params: PyTree, step: jax.Array) -> PyTree:
        """The piece's state after optimizer step `step` (0-based) produced `params` (traced)."""
        raise NotImplementedError

    def params_of(self, extra: PyTree) -> PyTree:
        """The parameters this piece stands for (for `use_for_eval` / `use_for_module`)."""
        for key in self.params_key:
            extra = extra[key]
        return extra

    def epoch_start(self, extra: PyTree, params: PyTree, opt_state: PyTree, epoch: jax.Array) -> PyTree:
        """The piece's state at the start of train epoch `epoch` (0-based, traced)."""
        return extra

    def learning_rate(self, extra: PyTree) -> jax.Array | None:
        """The learning rate imposed on the next update (traced float32 scalar, NaN: the
        optimizer's own), or None when this piece never imposes one (static)."""
        return None

    def guard(self, extra: PyTree, loss: jax.Array, step: jax.Array) -> tuple[PyTree, jax.Array]:
        """`(new state, keep)`: whether optimizer step `step`'s update (its loss `loss`, a traced
        float32 scalar) is kept (traced bool). Only called for pieces that override it."""
        return extra, jnp.asarray(True)

    def group_scales(self, extra: PyTree) -> tuple[dict[str, jax.Array], dict[str, jax.Array]] | None:
        """`(scales, stats)`: `{top-level parameter key: traced scale}` applied to those groups'
        updates (0: frozen), and `{key: 0 or 1}` (0: the group's model state is kept), or None
        when this piece scales nothing (static)."""
        return None

    @property
    def has_guard(self) -> bool:
        return type(self).guard is not StatePiece.guard

    def ends_training(self, epochs_done: int) -> bool:
        """Whether `final_params` replaces the parameters when training stops after
        `epochs_done` epochs (host value)."""
        return False

    def final_params(self, extra: PyTree, params: PyTree) -> PyTree:
        """The parameters training ends with (traced; same dtypes as `params`)."""
        return params

    @property
    def has_epoch_start(self) -> bool:
        return type(self).epoch_start is not StatePiece.epoch_start


class ExponentialMovingAverage(StatePiece):
    """`avg <- decay * avg + (1 - decay) * params` after every `every_n_steps`-th optimizer step.

    Like torch's `AveragedModel` with an EMA function (Lightning's `EMAWeightAveraging`), the
    first update (optimizer step 0) copies the parameters; updates happen after steps `i` with
    `i % every_n_steps == 0`. The average is kept in float32 (or the parameters' dtype when
    wider): a bf16 average with `decay=0.999` would round most updates away.
    """

    def __init__(self, name: str, *, decay: float, every_n_steps: int = 1, use_for_eval: bool = True,
                 use_for_module: bool = False):
        self.name = name
        self.decay = float(decay)
        self.every_n_steps = int(every_n_steps)
        self.use_for_eval = use_for_eval
        self.use_for_module = use_for_module

    def init(self, params: PyTree) -> PyTree:
        return jax.tree.map(lambda p: p.astype(jnp.promote_types(p.dtype, jnp.float32)), params)

    def update(self, extra: PyTree, params: PyTree, step: jax.Array) -> PyTree:
        due = step % self.every_n_steps == 0
        first = step == 0

        def one(avg, p):
            p = p.astype(avg.dtype)
            new = jnp.where(first, p, self.decay * avg + (1.0 - self.decay) * p)
            return new if self.every_n_steps == 1 else jnp.where(due, new, avg)  # static: no select

        return jax.tree.map(one, extra, params)


class StochasticAverage(StatePiece):
    """Stochastic weight averaging (torch's `AveragedModel` + `SWALR`, as Lightning configures them).

    At the start of each epoch `e` with `swa_start <= e <= swa_end` the parameters join the
    average: `avg <- p` for the first, then `avg <- avg_fn(avg, p, n)` (default
    `avg + (p - avg) / (n + 1)`), `n_averaged += 1`. From `swa_start` the learning rate anneals
    from `lr0`, the rate the optimizer state held then, to `swa_lr`: epoch `swa_start + j` uses
    `swa_lr * a + lr0 * (1 - a)` with `a = anneal(min(1, j / annealing_epochs))`, `anneal` being
    `(1 - cos(pi t)) / 2` ("cos") or `t` ("linear"); `annealing_epochs=0`: `swa_lr` at once. When training ends after `swa_end + 1`
    epochs the average replaces the parameters. All of it lives in the state (`average`,
    `n_averaged`, `lr0`, `lr`), so a resumed run continues it exactly. `lr0` is read from an
    `inject_hyperparams` state, else from `schedule` (the module's `lr_schedule`) at the count of
    the last update.

    `swa_start` and `swa_end` depend on `max_epochs`: the callback sets them when fit starts,
    before the first epoch traces `epoch_start`.
    """

    recompute_model_state = True
    params_key = ("average",)

    def __init__(self, name: str, *, swa_lr: float, annealing_epochs: int, annealing_strategy: str,
                 avg_fn: Callable | None = None):
        self.name = name
        self.swa_lr = float(swa_lr)
        self.annealing_epochs = int(annealing_epochs)
        self.annealing_strategy = annealing_strategy
        self.avg_fn = avg_fn or (lambda avg, p, n: avg + (p - avg) / (n + 1).astype(avg.dtype))
        self.swa_start: int | None = None  # 0-based epochs, set when fit starts
        self.swa_end: int | None = None
        # the module's `lr_schedule` when the optimizer holds no injected rate (set when fit starts)
        self.schedule: Callable | None = None

    def init(self, params: PyTree) -> PyTree:
        nan = jnp.full((), jnp.nan, jnp.float32)
        return {"average": jax.tree.map(lambda p: p.astype(jnp.promote_types(p.dtype, jnp.float32)), params),
                "n_averaged": jnp.zeros((), jnp.int32), "lr0": nan, "lr": nan}

    def update(self, extra: PyTree, params: PyTree, step: jax.Array) -> PyTree:
        return extra  # nothing per step: once per epoch, in `epoch_start`

    def epoch_start(self, extra: PyTree, params: PyTree, opt_state: PyTree, epoch: jax.Array) -> PyTree:
        if self.swa_start is None:
            raise RuntimeError(f"StochasticAverage({self.name!r}) runs before its epochs are known: "
                               "the StochasticWeightAveraging callback sets them when fit starts.")
        n = extra["n_averaged"]
        averaging = (epoch >= self.swa_start) & (epoch <= self.swa_end)

        def one(avg, p):
            p = p.astype(avg.dtype)
            return jnp.where(averaging, jnp.where(n == 0, p, self.avg_fn(avg, p, n)), avg)

        average = jax.tree.map(one, extra["average"], params)
        started = epoch >= self.swa_start
        lr0 = jnp.where(started & jnp.isnan(extra["lr0"]), lr_lib.last_used(opt_state, self.schedule), extra["lr0"])
        t = jnp.clip((epoch - self.swa_start).astype(jnp.float32) / max(1, self.annealing_epochs), 0.0, 1.0)
        if self.annealing_epochs == 0:  # torch's SWALR: the SWA rate from the first SWA epoch on
            t = jnp.ones_like(t)
        alpha = (1.0 - jnp.cos(jnp.pi * t)) / 2.0 if self.annealing_strategy == "cos" else t
        lr = jnp.where(alpha == 1.0, self.swa_lr, self.swa_lr * alpha + lr0 * (1.0 - alpha))
        return {"average": average, "n_averaged": n + averaging.astype(jnp.int32), "lr0": lr0,
                "lr": jnp.where(started, lr, jnp.nan).astype(jnp.float32)}

    def learning_rate(self, extra: PyTree) -> jax.Array:
        return extra["lr"]

    def ends_training(self, epochs_done: int) -> bool:
        # Lightning transfers the average once the last epoch (`swa_end`) is done
        return self.swa_start is not None and self.swa_start <= self.swa_end and epochs_done == self.swa_end + 1

    def final_params(self, extra: PyTree, params: PyTree) -> PyTree:
        some = extra["n_averaged"] > 0
        return jax.tree.map(lambda a, p: jnp.where(some, a.astype(p.dtype), p), extra["average"], params)


class SpikeGuard(StatePiece):
    """Lightning's loss-spike rule, judged inside the step (`fj.callbacks.SpikeDetection`).

    State: the last `window` accepted losses (a ring), how many were accepted, the last accepted
    one (`last`, 0 at first), the batch index in the epoch (reset by `epoch_start`), the first
    spike's `[batch, epoch, step]` (-1: none) and the count of skipped steps. A step's loss is
    a spike when the batch index is at least `warmup` and either it is not finite (with
    `finite_only`) or it is no better than `last` (mode "min": higher) and differs from the
    running mean by at least `atol` and by at least `rtol` times it (each None: no bound).
    A spike's loss does not join the statistics, nor does a non-finite one.

    With `skip_update` a spike's update is dropped and counted; otherwise the first spike is
    recorded and every later update is dropped too, so that the state stays the one before the
    spike until the host reads the record (at a log step) and stops the run.
    """

    def __init__(self, name: str, *, mode: str, window: int, warmup: int, atol: float | None,
                 rtol: float | None, finite_only: bool, skip_update: bool, batches_per_step: int):
        self.name, self.mode, self.window, self.warmup = name, mode, int(window), int(warmup)
        self.atol, self.rtol, self.finite_only = atol, rtol, bool(finite_only)
        self.skip_update, self.batches_per_step = bool(skip_update), int(batches_per_step)

    def init(self, params: PyTree) -> PyTree:
        del params
        zero = jnp.zeros((), jnp.int32)
        return {"losses": jnp.zeros((self.window,), jnp.float32), "count": zero, "last": jnp.zeros((), jnp.float32),
                "batch": zero, "epoch": zero, "spike": jnp.full((3,), -1, jnp.int32), "skipped": zero}

    def update(self, extra: PyTree, params: PyTree, step: jax.Array) -> PyTree:
        return extra  # judged in `guard`, before the update is kept

    def epoch_start(self, extra: PyTree, params: PyTree, opt_state: PyTree, epoch: jax.Array) -> PyTree:
        return {**extra, "batch": jnp.zeros((), jnp.int32), "epoch": epoch.astype(jnp.int32)}

    def guard(self, extra: PyTree, loss: jax.Array, step: jax.Array) -> tuple[PyTree, jax.Array]:
        loss = loss.astype(jnp.float32)
        batch = extra["batch"] + (self.batches_per_step - 1)  # Lightning's: the step's last batch
        filled = jnp.minimum(extra["count"], self.window)
        running = jnp.where(filled > 0, extra["losses"].sum() / filled.astype(jnp.float32), jnp.nan)
        finite = jnp.isfinite(loss)
        better = loss - extra["last"] <= 0.0 if self.mode == "min" else loss - extra["last"] >= 0.0
        off = jnp.abs(loss - running)
        far = jnp.asarray(True)
        if self.atol is not None:
            far = far & (off >= abs(self.atol))
        if self.rtol is not None:
            far = far & (off >= jnp.abs(self.rtol * running))
        judged = (~finite) if self.finite_only else jnp.asarray(False)
        spike = (batch >= self.warmup) & (judged | (~better & far))
        accept = ~spike & finite
        slot = extra["count"] % self.window
        losses = jnp.where(accept, extra["losses"].at[slot].set(loss), extra["losses"])
        first = spike & (extra["spike"][0] < 0)
        record = jnp.where(first, jnp.stack([batch, extra["epoch"], step.astype(jnp.int32)]), extra["spike"])
        new = {**extra, "losses": losses, "count": extra["count"] + accept.astype(jnp.int32),
               "last": jnp.where(accept, loss, extra["last"]), "batch": extra["batch"] + self.batches_per_step,
               "spike": record, "skipped": extra["skipped"] + spike.astype(jnp.int32)}
        halted = extra["spike"][0] >= 0
        keep = ~spike if self.skip_update else ~(spike | halted)
        return new, keep


class FinetuningScales(StatePiece):
    """Per-group update scales by epoch, for `fj.BaseFinetuning` (frozen groups, backbone rates).

    State: `{"scale": {group: scale}, "stats": {group: 1 or 0}}` (float32 scalars), one per
    top-level parameter key.
    `table[e]` is the scales of (0-based) train epoch `e` (the last row for later epochs), computed
    on the host when fit starts and set by `epoch_start`, one jitted function compiled once: a
    change of scale at an epoch recompiles nothing, and a resumed run restores the scales with the
    state. A scale of 0 freezes the group (see `StatePiece.group_scales`); `keep_stats` lists the
    groups whose model state (BatchNorm statistics) also stays as it was while frozen.
    """

    def __init__(self, name: str):
        self.name = name
        self.groups: tuple[str, ...] = ()  # every top-level parameter key, known at `init`
        self.table: list[list[float]] | None = None  # [epochs, groups], set when fit starts
        self.keep_stats: list[list[bool]] | None = None

    def init(self, params: PyTree) -> PyTree:
        if not isinstance(params, dict):
            raise TypeError(f"fine-tuning freezes top-level parameter groups, but the module's parameters are a "
                            f"{type(params).__name__}, not a dict of submodules.")
        self.groups = tuple(params)
        return {"scale": {g: jnp.ones((), jnp.float32) for g in self.groups},
                "stats": {g: jnp.ones((), jnp.float32) for g in self.groups}}

    def update(self, extra: PyTree, params: PyTree, step: jax.Array) -> PyTree:
        return extra

    def epoch_start(self, extra: PyTree, params: PyTree, opt_state: PyTree, epoch: jax.Array) -> PyTree:
        if self.table is None:
            raise RuntimeError(f"FinetuningScales({self.name!r}) runs before its table is known: the "
                               "BaseFinetuning callback computes it when fit starts.")
        row = jnp.minimum(epoch, len(self.table) - 1)
        table = jnp.asarray(self.table, jnp.float32)[row]
        stats = jnp.asarray(self.keep_stats, jnp.float32)[row]
        return {"scale": {g: table[i] for i, g in enumerate(self.groups)},
                "stats": {g: 1.0 - stats[i] for i, g in enumerate(self.groups)}}

    def group_scales(self, extra: PyTree) -> tuple[dict[str, jax.Array], dict[str, jax.Array]]:
        return extra["scale"], extra["stats"]


def _group_of(path, groups) -> str | None:
    for entry in path:
        key = getattr(entry, "key", None)
        if isinstance(key, str) and key in groups:
            return key
    return None


def group_scales(pieces: Sequence[StatePiece], extras) -> tuple[dict, dict] | None:
    """`(scales, stats)` of the pieces that scale parameter groups (`{group: traced scalar}`
    each, multiplied over pieces; stats 0: the group's model state is kept), or None when none
    does (static: the step is then the plain one)."""
    scales, stats = {}, {}
    for piece in pieces:
        found = piece.group_scales(extras[piece.name])
        if found is None:
            continue
        for into, new in zip((scales, stats), found):
            for g, s in new.items():
                into[g] = into[g] * s if g in into else s
    return (scales, stats) if scales else None


def scale_groups(tree: PyTree, scales: dict[str, jax.Array]) -> PyTree:
    """Each leaf under a scaled group (found by the first dict key on its path naming one)
    multiplied by its scale, in its own dtype; `where` keeps a frozen group's non-finite values out."""
    def one(path, leaf):
        g = _group_of(path, scales)
        if g is None:
            return leaf
        s = scales[g]
        return jnp.where(s == 0, jnp.zeros_like(leaf), leaf * s.astype(leaf.dtype))
    return jax.tree_util.tree_map_with_path(one, tree)


def keep_frozen(new: PyTree, old: PyTree, scales: dict[str, jax.Array]) -> PyTree:
    """`new` with the leaves of frozen groups (scale 0) taken from `old`: a frozen group's
    optimizer moments (or model state) do not change."""
    def one(path, n, o):
        g = _group_of(path, scales)
        return n if g is None else jnp.where(scales[g] == 0, o, n)
    return jax.tree_util.tree_map_with_path(one, new, old)


def check_pieces(pieces: Sequence[StatePiece]) -> tuple[StatePiece, ...]:
    """The pieces as a tuple; raises when two share a name or one is not a `StatePiece`."""
    seen = set()
    for piece in pieces:
        if not isinstance(piece, StatePiece):
            raise TypeError(f"Callback.step_pieces() must return fitjax.step.pieces.StatePiece objects, "
                            f"got {piece!r}.")
        if piece.name in seen:
            raise ValueError(f"two step pieces are named {piece.name!r} (e.g. two EMA callbacks): give "
                             "each its own `name=`.")
        seen.add(piece.name)
    return tuple(pieces)


def init_extras(pieces: Sequence[StatePiece], params: PyTree) -> dict[str, PyTree] | None:
    """`TrainState.extras` at the start (None without pieces: nothing is added to the state)."""
    return {piece.name: piece.init(params) for piece in pieces} if pieces else None


def update_extras(pieces: Sequence[StatePiece], extras, params: PyTree, step: jax.Array):
    """Every piece's state after optimizer step `step` produced `params` (inside the step)."""
    if not pieces:
        return extras
    return {**extras, **{piece.name: piece.update(extras[piece.name], params, step) for piece in pieces}}


def guard(pieces: Sequence[StatePiece], extras, loss: jax.Array, step: jax.Array):
    """`(extras, keep)` after the pieces that judge a step's loss (`StatePiece.guard`) saw it;
    None when no piece does (static: the step is then the plain one)."""
    guards = [piece for piece in pieces if piece.has_guard]
    if not guards:
        return None
    keep = jnp.asarray(True)
    extras = dict(extras)
    for piece in guards:
        extras[piece.name], kept = piece.guard(extras[piece.name], loss, step)
        keep = keep & kept
    return extras, keep


def epoch_start(pieces: Sequence[StatePiece], extras, params: PyTree, opt_state: PyTree, epoch: jax.Array):
    """Every piece's state at the start of train epoch `epoch` (traced; see `StatePiece.epoch_start`)."""
    return {**extras, **{piece.name: piece.epoch_start(extras[piece.name], params, opt_state, epoch)
                         for piece in pieces if piece.has_epoch_start}}


def learning_rate(pieces: Sequence[StatePiece], extras) -> jax.Array | None:
    """The learning rate a piece imposes on the next update (traced), or None when none does
    (static). With several, the last one's that is not NaN."""
    found = None
    for piece in pieces:
        lr = piece.learning_rate(extras[piece.name])
        if lr is not None:
            found = lr if found is None else jnp.where(jnp.isnan(lr), found, lr)
    return found


def _standing_in(state: TrainState, pieces: Sequence[StatePiece], flag: str) -> PyTree:
    chosen = [p for p in pieces if getattr(p, flag)]
    if not chosen or state.extras is None:
        return state.params
    piece = chosen[-1]
    # back to the parameters' dtypes: the eval step was compiled for them
    return jax.tree.map(lambda a, p: a if a.dtype == p.dtype else a.astype(p.dtype),
                        piece.params_of(state.extras[piece.name]), state.params)


def eval_params_key(pieces: Sequence[StatePiece]) -> list[str] | None:
    """Where in a saved train state the parameters for evaluation are (`["extras", name, ...]`,
    the last `use_for_eval` piece's), or None for `params`: checkpoints record it, so that
    evaluating or loading one uses what validation during fit used."""
    chosen = [p for p in pieces if p.use_for_eval]
    return ["extras", chosen[-1].name, *chosen[-1].params_key] if chosen else None


def eval_params(state: TrainState, pieces: Sequence[StatePiece]) -> PyTree:
    """The parameters validation, test and predict use: the last `use_for_eval` piece's, else
    `state.params`."""
    return _standing_in(state, pieces, "use_for_eval")


def module_params(state: TrainState, pieces: Sequence[StatePiece]) -> PyTree:
    """The parameters handed back to the module after fit: the last `use_for_module` piece's,
    else `state.params`."""
    return _standing_in(state, pieces, "use_for_module")
