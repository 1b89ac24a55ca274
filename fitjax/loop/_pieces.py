"""The loop's side of the state pieces (`fitjax.step.pieces`): the epoch-start update and the end
of training, each one jitted function with the state's shardings, compiled once per fit."""

from __future__ import annotations

import itertools
from typing import Callable, Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fitjax.data import checked_batches
from fitjax.loop import _checks as checks
from fitjax.loop._checks import maybe_len as _maybe_len
from fitjax.state import TrainState
from fitjax.step import compiling, pieces as pieces_lib
from fitjax.step.running_stats import make_running_average
from fitjax.strategies import Strategy

__all__ = ["PieceRunner", "statistics_batches"]

_STATS_RNG_SALT = 0x57A75  # the statistics pass draws its own keys (dropout), apart from the steps'


class PieceRunner:
    """Runs the pieces' per-epoch and end-of-training work on the train state."""

    def __init__(self, pieces: Sequence[pieces_lib.StatePiece], strategy: Strategy, shardings: TrainState):
        self.pieces = tuple(pieces)
        self.strategy = strategy
        self.shardings = shardings
        starting = tuple(p for p in self.pieces if p.has_epoch_start)
        self._epoch_start = None
        if starting:
            def pieces_epoch_start(extras, params, opt_state, epoch):  # the name compile logs show
                return pieces_lib.epoch_start(starting, extras, params, opt_state, epoch)

            # the extras donated: updated in place, as the train step updates the state
            self._epoch_start = compiling.jit(
                strategy, pieces_epoch_start, in_shardings=(shardings.extras, shardings.params, shardings.opt_state,
                                                  strategy.replicated),
                out_shardings=shardings.extras, donate_argnums=(0,))

    def epoch_start(self, state: TrainState, epoch: int) -> TrainState:
        """`state` with every piece's epoch-start update for train epoch `epoch` applied (the
        epoch is an array: one compilation for every epoch)."""
        if self._epoch_start is None:
            return state
        extras = self._epoch_start(state.extras, state.params, state.opt_state, np.asarray(epoch, np.int32))
        return state.replace(extras=extras)

    def end_training(self, state: TrainState, epochs_done: int, spec, policy,
                     batches: Callable[[], Iterable]) -> TrainState:
        """`state` with the parameters the pieces end training with (`StatePiece.final_params`)
        and then, when one asks, the model state's running statistics recomputed over
        `batches()` (host train batches; one compiled shape: those shaped otherwise than the
        first are skipped)."""
        ending = tuple(p for p in self.pieces if p.ends_training(epochs_done))
        if not ending:
            return state
        sh = self.shardings

        def pieces_final_params(extras, params):
            for piece in ending:
                params = piece.final_params(extras[piece.name], params)
            return params

        params = compiling.jit(self.strategy, pieces_final_params, in_shardings=(sh.extras, sh.params),
                              out_shardings=sh.params)(state.extras, state.params)
        state = state.replace(params=params)
        has_floats = any(jnp.issubdtype(x.dtype, jnp.floating) for x in jax.tree.leaves(state.model_state))
        if any(p.recompute_model_state for p in ending) and has_floats:
            state = state.replace(model_state=self._recompute(state, spec, policy, batches()))
        return state

    def _recompute(self, state: TrainState, spec, policy, batches: Iterable):
        sh, replicated = self.shardings, self.strategy.replicated
        average_step = compiling.jit(
            self.strategy, make_running_average(spec, policy),
            in_shardings=(sh.params, sh.model_state, sh.model_state, replicated, replicated,
                          self.strategy.batch_sharding),
            out_shardings=sh.model_state)
        average, shape, n = state.model_state, None, 0
        for batch in batches:
            leaves_shape = [np.shape(x) for x in jax.tree.leaves(batch)]
            shape = shape or leaves_shape
            if leaves_shape != shape:
                continue
            rng = jax.random.fold_in(state.rng, _STATS_RNG_SALT + n)
            average = average_step(state.params, state.model_state, average, np.asarray(n, np.int32), rng,
                                   self.strategy.shard_batch(batch))
            n += 1
        return average


def statistics_batches(loader, epoch: int, limit) -> Iterable:
    """The train batches a statistics pass at the end of training reads (Lightning's extra
    epoch: the next epoch's order, `limit_train_batches` of them)."""
    if hasattr(loader, "set_epoch"):
        loader.set_epoch(epoch)
    return itertools.islice(checked_batches(loader), checks.apply_limit(limit, _maybe_len(loader)))
