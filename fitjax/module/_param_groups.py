"""`fj.param_groups`: one optax transformation per group of parameters, chosen by name pattern.

A thin layer over `optax.multi_transform`: each parameter's dotted name (`backbone.Dense_0.kernel`,
the names `load_weights` and the model summary use) is matched against the patterns in order, and
the first match's transformation updates it. A group given `None` is frozen: its update is zero
(`optax.set_to_zero`) and it holds no optimizer state at all (multi_transform gives each
transformation only its own group's parameters, so Adam's moments exist for the trained groups
alone), and the train step computes no gradient for it (`fitjax.step.trainable`: the loss is
differentiated with respect to the trained groups only).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import jax
import optax

from fitjax._typing import PyTree
from fitjax.step import trainable

__all__ = ["param_groups"]

_FROZEN = "frozen"


def param_groups(groups: Mapping[str, optax.GradientTransformation | None],
                 default: optax.GradientTransformation | None | str = "error") -> optax.GradientTransformation:
    """One transformation per group of parameters, chosen by regexes on their dotted names.

    Args:
        groups: `{regex: transformation}`, tried in order, the first whose pattern matches a whole
            name wins; a transformation `None` freezes the group (no update, no optimizer state).
        default: the transformation for parameters no pattern matches; `None` freezes them;
            `"error"` (the default) makes an unmatched parameter an error naming it.

    Returns:
        An `optax.GradientTransformation` for `configure_optimizer` to return.

    Example:
        >>> import fitjax as fj, optax
        >>> tx = fj.param_groups({r"backbone\\..*": optax.adamw(1e-5, weight_decay=0.01),
        ...                       r"head\\..*": optax.adamw(1e-3, weight_decay=0.0)})
    """
    if not isinstance(groups, Mapping) or not groups:
        raise TypeError(f"param_groups(groups=...) must be a non-empty dict {{regex: optax transformation or None}}; "
                        f"got {groups!r}.")
    patterns = []
    for i, (pattern, tx) in enumerate(groups.items()):
        try:
            patterns.append(re.compile(pattern))
        except re.error as error:
            raise ValueError(f"param_groups: {pattern!r} is not a regular expression ({error}).") from None
        _check_tx(tx, f"param_groups(groups={{{pattern!r}: ...}})")
    if not (isinstance(default, str) and default == "error"):
        _check_tx(default, "param_groups(default=...)")
    labels_of = [_FROZEN if tx is None else f"group_{i}" for i, tx in enumerate(groups.values())]
    default_label = "default" if default is not None else _FROZEN

    def label(path, _) -> str:
        name = ".".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)
        for pattern, group in zip(patterns, labels_of):
            if pattern.fullmatch(name):
                return group
        if isinstance(default, str):
            raise ValueError(f"param_groups: the parameter {name!r} matches none of the patterns "
                             f"{list(groups)}; add a pattern for it, or pass `default=` (a transformation, "
                             "or None to freeze what no pattern names).")
        return default_label

    def labels(params: PyTree) -> PyTree:
        return jax.tree_util.tree_map_with_path(label, params)

    transforms = {f"group_{i}": tx for i, tx in enumerate(groups.values()) if tx is not None}
    transforms[_FROZEN] = optax.set_to_zero()  # stateless: a frozen group holds nothing
    if default is not None and not isinstance(default, str):
        transforms["default"] = default
    tx = optax.multi_transform(transforms, labels)
    if _FROZEN not in (*labels_of, default_label):
        return tx
    return trainable.mark(tx, lambda params: jax.tree.map(lambda group: group == _FROZEN, labels(params)))


def _check_tx(tx, where: str) -> None:
    if tx is not None and not (callable(getattr(tx, "init", None)) and callable(getattr(tx, "update", None))):
        raise TypeError(f"{where} must be an optax transformation (e.g. `optax.adamw(1e-4)`) or None (frozen); "
                        f"got {type(tx).__name__}: {tx!r}.")
