"""A checkpoint's saved tree against this run's state: the first field, then the first leaf, that
differs in presence or shape, as an error naming it, what it is and how to fix it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax

from fitjax._typing import PyTree

__all__ = ["LOAD_WEIGHTS", "check_tree", "path_str"]

_MODULE_FIX = ("The module changed since the save: build it as it was (same layers and sizes), or "
               "start a new run without ckpt_path.")
LOAD_WEIGHTS = ("or start a new run without ckpt_path (`MyModule.load_from_checkpoint(path)` loads "
                 "the weights alone).")
# What each TrainState field is, for errors; a field missing here is named as `TrainState.<name>`.
_FIELDS = {
    "params": ("parameters", _MODULE_FIX),
    "model_state": ("model state", _MODULE_FIX),
    "opt_state": ("optimizer state", "The optimizer differs from the one it was saved with (a "
                  "different optax transform, chain or schedule in configure_optimizer): resume "
                  f"with that optimizer, {LOAD_WEIGHTS}"),
    "metrics": ("train-metric accumulators", "The module's `metrics` returns other names than at the "
                f"save: resume with the same metrics, {LOAD_WEIGHTS}"),
}
# Fields that exist only with one Trainer option: field -> (what it is, the option, its value).
_OPTION_FIELDS = {"loss_scale": ("loss scale", "precision", "16-mixed")}


def check_tree(saved: PyTree, target: PyTree, path: Path, *, saved_options: dict[str, Any],
                options: dict[str, Any]) -> None:
    """Raises a `ValueError` naming the first field, then the first leaf in it, that differs in
    presence or shape between the checkpoint and this run's state."""
    where = f"checkpoint {str(path)!r}"
    order = ["params", "model_state", "opt_state"]
    fields = order + sorted(name for name in {*saved, *target} if name not in order)
    for field in fields:
        if field in saved and field in target:
            _check_field(field, saved[field], target[field], where)
        elif field in saved or field in target:
            raise ValueError(_presence_error(field, where, in_checkpoint=field in saved,
                                             saved_options=saved_options, options=options))


def _presence_error(field: str, where: str, *, in_checkpoint: bool, saved_options: dict[str, Any],
                    options: dict[str, Any]) -> str:
    if field in _OPTION_FIELDS:
        what, option, value = _OPTION_FIELDS[field]
        saved = (f"{option}={saved_options[option]!r}" if option in saved_options
                 else f"{option}={value!r}" if in_checkpoint else f"a {option} other than {value!r}")
        ours = (f"{option}={options[option]!r}" if option in options
                else f"{option}={value!r}" if not in_checkpoint else f"a {option} other than {value!r}")
        back = f"{option}={saved_options[option]!r}" if option in saved_options else saved
        if in_checkpoint:
            return (f"{where} has a {what} (TrainState.{field}): it was saved with {saved}, and this "
                    f"run, with {ours}, has none. Resume with {back}, {LOAD_WEIGHTS}")
        return (f"this checkpoint has no {what}: it was saved with {saved}, and this run uses {ours}, "
                f"which needs one ({where}, TrainState.{field}). Resume with {back}, {LOAD_WEIGHTS}")
    what, fix = _FIELDS.get(field, (f"TrainState.{field}", f"Resume with the options it was saved "
                                    f"with, {LOAD_WEIGHTS}"))
    side = "has" if in_checkpoint else "has no"
    other = "this run has none" if in_checkpoint else "this run has one"
    return f"{where} {side} {what} ('{field}') and {other}. {fix}"


def _check_field(field: str, saved: PyTree, target: PyTree, where: str) -> None:
    def flat(tree):
        leaves = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: x is None)[0]
        return {"/".join(filter(None, (field, path_str(p)))): v for p, v in leaves if v is not None}

    what, fix = _FIELDS.get(field, (f"TrainState.{field}", "Resume with the options it was saved "
                                    f"with, {LOAD_WEIGHTS}"))
    if field in _OPTION_FIELDS:
        what = _OPTION_FIELDS[field][0]
    owner = "the module" if field in ("params", "model_state") else f"this run's {what}"
    mine = "module" if owner == "the module" else "this run's"
    have, want = flat(saved), dict(sorted(flat(target).items()))
    for name, leaf in want.items():
        if name not in have:
            raise ValueError(f"{where} does not match {owner}: it has no '{name}' ({owner}'s is "
                             f"{tuple(leaf.shape)}). {fix}")
        if tuple(have[name].shape) != tuple(leaf.shape):
            raise ValueError(f"{where} does not match {owner} at '{name}': saved shape "
                             f"{tuple(have[name].shape)}, {mine} shape {tuple(leaf.shape)}. {fix}")
    extra = sorted(name for name in have if name not in want)
    if extra:
        raise ValueError(f"{where} does not match {owner}: it has '{extra[0]}', which {owner} "
                         f"lacks. {fix}")


def path_str(key_path: tuple) -> str:
    parts = []
    for key in key_path:
        for attr in ("key", "name", "idx"):
            if hasattr(key, attr):
                parts.append(str(getattr(key, attr)))
                break
        else:
            parts.append(str(key))
    return "/".join(parts)
