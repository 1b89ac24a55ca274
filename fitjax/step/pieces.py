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
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp

from fitjax._typing import PyTree
from fitjax.state import TrainState

__all__ = ["ExponentialMovingAverage", "StatePiece", "check_pieces", "eval_params", "init_extras",
           "module_params", "update_extras"]


class StatePiece:
    """Abstract: one piece around the train step holding `TrainState.extras[name]`.

    Attributes:
        name: its key in `TrainState.extras` (unique among a trainer's pieces).
        use_for_eval: validation, test and predict use `params_of(extra)` instead of the params.
        use_for_module: `module.variables` after fit holds `params_of(extra)`.
    """

    name: str = ""
    use_for_eval: bool = False
    use_for_module: bool = False

    def init(self, params: PyTree) -> PyTree:
        """The piece's initial state from the initial parameters (traced)."""
        raise NotImplementedError

    def update(self, extra: PyTree, params: PyTree, step: jax.Array) -> PyTree:
        """The piece's state after optimizer step `step` (0-based) produced `params` (traced)."""
        raise NotImplementedError

    def params_of(self, extra: PyTree) -> PyTree:
        """The parameters this piece stands for (for `use_for_eval` / `use_for_module`)."""
        return extra


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


def _standing_in(state: TrainState, pieces: Sequence[StatePiece], flag: str) -> PyTree:
    chosen = [p for p in pieces if getattr(p, flag)]
    if not chosen or state.extras is None:
        return state.params
    piece = chosen[-1]
    # back to the parameters' dtypes: the eval step was compiled for them
    return jax.tree.map(lambda a, p: a if a.dtype == p.dtype else a.astype(p.dtype),
                        piece.params_of(state.extras[piece.name]), state.params)


def eval_params(state: TrainState, pieces: Sequence[StatePiece]) -> PyTree:
    """The parameters validation, test and predict use: the last `use_for_eval` piece's, else
    `state.params`."""
    return _standing_in(state, pieces, "use_for_eval")


def module_params(state: TrainState, pieces: Sequence[StatePiece]) -> PyTree:
    """The parameters handed back to the module after fit: the last `use_for_module` piece's,
    else `state.params`."""
    return _standing_in(state, pieces, "use_for_module")
