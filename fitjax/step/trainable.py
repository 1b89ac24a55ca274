"""Which parameters train: a frozen part gets no gradient, no update and no optimizer state.

An optimizer may say which parameters it never changes (`fj.param_groups` with a group `None`,
`LitModule.apply_lora`'s base weights) by carrying a predicate (`mark`). The build then gives
the optimizer only the rest (`restrict`: its state exists for the trained part alone) and the
step differentiates the loss only with respect to the rest (`Trainable.split`): the frozen part
is a constant of the step, so XLA computes no gradient for it, accumulates none and clips none.
Measured on a LoRA fine-tune of the GPT example: `benchmarks/lora.py`.

The predicate reads the parameters' names only, so the split is static: one program, as before.
An optimizer without a mark (any optax transformation, `param_groups` inside an `optax.chain`)
trains every parameter it is given, as it always did.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import optax

from fitjax._typing import PyTree

__all__ = ["Trainable", "mark", "of", "restrict"]

_ATTRIBUTE = "fitjax_frozen"  # on a marked transformation: `params -> tree of bools (True: frozen)`


class _Marked(optax.GradientTransformationExtraArgs):
    """An optax transformation that carries which parameters it freezes (as an attribute)."""


def mark(tx: optax.GradientTransformation, frozen: Callable[[PyTree], PyTree]) -> optax.GradientTransformation:
    """`tx`, carrying `frozen(params) -> tree of bools` (True: the parameter never changes; a
    static function of the names). `tx` must give frozen parameters a zero update."""
    tx = optax.with_extra_args_support(tx)
    marked = _Marked(tx.init, tx.update)
    setattr(marked, _ATTRIBUTE, frozen)
    return marked


def of(tx: optax.GradientTransformation) -> "Trainable | None":
    """The parameters `tx` trains, when it was marked; None: all of them."""
    frozen = getattr(tx, _ATTRIBUTE, None)
    return None if frozen is None else Trainable(frozen)


@dataclasses.dataclass(frozen=True)
class Trainable:
    """Splits parameters into the trained part and the frozen part (trees with `None` where a
    parameter belongs to the other part) and merges them back."""

    frozen: Callable[[PyTree], PyTree]

    def split(self, params: PyTree) -> tuple[PyTree, PyTree]:
        mask = self.frozen(params)
        trained = jax.tree.map(lambda p, f: None if f else p, params, mask)
        return trained, jax.tree.map(lambda p, f: p if f else None, params, mask)

    def merge(self, trained: PyTree, frozen: PyTree) -> PyTree:
        return jax.tree.map(lambda t, f: f if t is None else t, trained, frozen, is_leaf=lambda x: x is None)

    def mask(self, params: PyTree) -> PyTree:
        """`{...: True}` where a parameter trains (the model summary's count)."""
        return jax.tree.map(lambda f: not f, self.frozen(params))


def restrict(tx: optax.GradientTransformation, trainable: Trainable | None) -> optax.GradientTransformation:
    """`tx` (the user's optimizer, clipping chained before it) over the trained parameters
    only: `init` is given all of them and keeps the trained part's state; `update` takes the
    trained part's gradients. Marked, so the step finds the split (`of`)."""
    if trainable is None:
        return tx
    tx = optax.with_extra_args_support(tx)
    return mark(optax.GradientTransformationExtraArgs(lambda params: tx.init(trainable.split(params)[0]),
                                                      tx.update), trainable.frozen)
