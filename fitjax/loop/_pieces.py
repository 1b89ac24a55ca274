"""The loop's side of the state pieces (`fitjax.step.pieces`): the epoch-start update and the end
of training, each one jitted function with the state's shardings, compiled once per fit; and
`Pieces`, the part of `Trainer` that ends training with them and hands the module its weights."""

from __future__ import annotations

import itertools
from typing import Callable, Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fitjax.data import checked_batches
from fitjax.loop import _checks as checks
from fitjax.loop._checks import maybe_len as _maybe_len
from fitjax.module import LitModule
from fitjax.state import TrainState
from fitjax.step import pieces as pieces_lib
from fitjax.step.running_stats import make_running_average
from fitjax.strategies import Strategy

__all__ = ["PieceRunner", "Pieces"]

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
            self._epoch_start = strategy.jit(
                pieces_epoch_start, in_shardings=(shardings.extras, shardings.params, shardings.opt_state,
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

        params = self.strategy.jit(pieces_final_params, in_shardings=(sh.extras, sh.params),
                                   out_shardings=sh.params)(state.extras, state.params)
        state = state.replace(params=params)
        has_floats = any(jnp.issubdtype(x.dtype, jnp.floating) for x in jax.tree.leaves(state.model_state))
        if any(p.recompute_model_state for p in ending) and has_floats:
            state = state.replace(model_state=self._recompute(state, spec, policy, batches()))
        return state

    def _recompute(self, state: TrainState, spec, policy, batches: Iterable):
        sh, replicated = self.shardings, self.strategy.replicated
        average_step = self.strategy.jit(
            make_running_average(spec, policy),
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


class Pieces:
    """The pieces' part of `Trainer`: their end of training, the weights for the module and eval."""

    def _end_pieces(self, module: LitModule, train_loader) -> None:
        """Pieces that end training with other parameters (SWA's average) set them, and the model
        state is recomputed with one pass over the train data when they ask (BatchNorm)."""
        def batches():
            if hasattr(train_loader, "set_epoch"):  # Lightning's extra epoch: the next epoch's order
                train_loader.set_epoch(self.current_epoch)
            limit = checks.apply_limit(self.limits["train"], _maybe_len(train_loader))
            return itertools.islice(checked_batches(train_loader), limit)

        self.state = self._pieces.end_training(self.state, self.current_epoch, module.step_spec(),
                                               self.step_options.precision, batches)

    def _sync_module(self, module: LitModule) -> None:
        """Hands the trained variables back to the module (and into an NNX model object)."""
        module._set_variables(pieces_lib.module_params(self.state, self.step_options.pieces),
                              self.state.model_state)

    def _eval_params(self):
        """The parameters eval uses: an averaged copy when a piece asks (`EMA(use_for_eval=True)`)."""
        return pieces_lib.eval_params(self.state, self.step_options.pieces)
