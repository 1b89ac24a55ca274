"""Weights from outside a fit (`LitModule.load_weights`, `load_state_dict`): names mapped, shapes
and dtypes checked, arrays placed into the strategy's shardings when the state is built.

The model's arrays are named by their dotted paths: `params` as they are (`block_0.up.kernel`),
`model_state` as well (`batch_stats.BatchNorm_0.mean` for Linen, `bn.mean` for NNX). A source's
names go through `mapping` (regexes or a function) to these names; `transpose` names the target
arrays whose layout differs (a torch `Linear.weight` is `[out, in]`, a flax kernel `[in, out]`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np

from fitjax._typing import PyTree
from fitjax.module._weight_sources import Placement, Source, open_source

__all__ = ["RestoredWith", "WeightsLoad", "WeightsReport"]

NameMap = Mapping[str, str | None] | Callable[[str], str | None] | None
Transpose = str | Sequence[str] | Mapping[str, Sequence[int]]
_SHOWN = 12  # problems listed by name in one error before "... and N more"


class WeightsReport(NamedTuple):
    """What a load did, by the model's array names (Lightning's `load_state_dict` returns the
    two lists as `missing_keys` and `unexpected_keys`).

    Attributes:
        loaded: the model's arrays given by the source.
        missing_keys: the model's arrays the source has no value for (they keep their
            initialised values).
        unexpected_keys: the source's names (after `mapping`) that name no array of the model.
    """

    loaded: tuple[str, ...]
    missing_keys: list[str]
    unexpected_keys: list[str]


@dataclasses.dataclass(frozen=True)
class WeightsLoad:
    """One pending load: checked against the model's arrays (`check`), then read into their
    shardings when a trainer builds the state (`place`)."""

    source: Source
    mapping: NameMap
    transpose: Transpose
    strict: bool
    owner: str

    @classmethod
    def make(cls, source: Any, *, mapping: NameMap, transpose: Transpose, strict: bool, owner: str
             ) -> "WeightsLoad":
        if mapping is not None and not callable(mapping) and not isinstance(mapping, Mapping):
            raise TypeError(f"{owner}.load_weights(mapping=...) must be a dict {{regex: new name or None}} or a "
                            f"function name -> new name (None drops it); got {mapping!r}.")
        if isinstance(mapping, Mapping):
            for pattern in mapping:
                _compile(pattern, f"{owner}.load_weights(mapping=...)")
        for pattern in _transpose_rules(transpose, owner):
            _compile(pattern, f"{owner}.load_weights(transpose=...)")
        return cls(open_source(source), mapping, transpose, bool(strict), owner)

    # ----------------------------------------------------------------------------- the check

    def plan(self, targets: Mapping[str, jax.ShapeDtypeStruct], optional: frozenset[str] = frozenset()
             ) -> tuple[dict[str, tuple[str, tuple[int, ...] | None]], WeightsReport]:
        """`({target name: (source name, perm)}, report)`; raises naming every array whose shape
        or dtype differs, every name two source arrays map to, and with `strict` every missing
        and unexpected one. `optional`: targets that may stay missing (NNX rng counters)."""
        entries = self.source.entries()
        chosen: dict[str, tuple[str, tuple[int, ...] | None]] = {}
        unexpected, problems = [], []
        for name, entry in entries.items():
            target = self._rename(name)
            if target is None:
                continue
            if target not in targets:
                unexpected.append(target if target == name else f"{target} (from {name})")
                continue
            if target in chosen:
                problems.append(f"{target}: given twice, by {chosen[target][0]!r} and {name!r}")
                continue
            perm = self._perm(target, len(entry.shape))
            shape = entry.shape if perm is None else tuple(entry.shape[a] for a in perm)
            want = targets[target]
            where = target if target == name else f"{target} (from {name})"
            if shape != tuple(want.shape):
                moved = "" if perm is None else f", {perm} of {tuple(entry.shape)}"
                problems.append(f"{where}: shape {shape}{moved} in the source, {tuple(want.shape)} in the model")
            elif not _castable(entry.dtype, want.dtype):
                problems.append(f"{where}: dtype {entry.dtype} in the source, {want.dtype} in the model")
            chosen[target] = (name, perm)
        missing = [t for t in targets if t not in chosen and t not in optional]
        if self.strict:
            problems += [f"{t}: missing from the source" for t in missing]
            problems += [f"{u}: in the source, not in the model" for u in unexpected]
        if problems:
            raise ValueError(self._error(problems, targets, entries))
        return chosen, WeightsReport(tuple(chosen), missing, unexpected)

    def _rename(self, name: str) -> str | None:
        if self.mapping is None:
            return name
        if callable(self.mapping):
            return self.mapping(name)
        for pattern, replacement in self.mapping.items():
            match = re.fullmatch(pattern, name)
            if match:
                return None if replacement is None else match.expand(replacement)
        return name

    def _perm(self, target: str, ndim: int) -> tuple[int, ...] | None:
        for pattern, perm in _transpose_rules(self.transpose, self.owner).items():
            if re.fullmatch(pattern, target):
                perm = tuple(range(ndim))[::-1] if perm is None else tuple(perm)
                if sorted(perm) != list(range(ndim)):
                    raise ValueError(f"{self.owner}.load_weights(transpose={{{pattern!r}: {perm!r}}}): {target!r} "
                                     f"has {ndim} axes, so the order must be a permutation of {tuple(range(ndim))}.")
                return perm
        return None

    def _error(self, problems: list[str], targets, entries) -> str:
        shown = "\n  ".join(problems[:_SHOWN])
        more = f"\n  ... and {len(problems) - _SHOWN} more" if len(problems) > _SHOWN else ""
        return (f"{self.owner}.load_weights from {self.source.description} does not fit the model "
                f"({len(entries)} arrays in the source, {len(targets)} in the model):\n  {shown}{more}\n"
                f"The model's names look like {_examples(targets)}; the source's like {_examples(entries)}. "
                "Map the source's names with `mapping={regex: new name}` (None drops an array), "
                "transpose layouts with `transpose=[regex]`, or pass `strict=False` to load what matches "
                "and keep the model's own values for the rest.")

    # ------------------------------------------------------------------------- the placement

    def place(self, abstract: tuple[PyTree, PyTree], shardings: tuple[PyTree, PyTree],
              initial: Callable[[], tuple[PyTree, PyTree]], optional: frozenset[str] = frozenset()
              ) -> tuple[tuple[PyTree, PyTree], WeightsReport]:
        """`((params, model_state), report)`: the loaded arrays in `shardings`, the others from
        `initial()` (called only when some array is not loaded)."""
        targets, leaves, treedef = _named(abstract, shardings)
        chosen, report = self.plan(targets, optional)
        placements = [Placement(chosen[name][0], targets[name], chosen[name][1]) for name in chosen]
        loaded = dict(zip(chosen, self.source.place(placements)))
        if len(loaded) < len(targets):
            rest, _, _ = _named(initial(), shardings, keep=True)
            loaded = {name: loaded.get(name, rest.get(name)) for name in targets}
        return jax.tree.unflatten(treedef, [loaded[name] for name in leaves]), report


def export_arrays(variables: tuple[PyTree, PyTree], *, mapping: NameMap, transpose: Transpose, dtype: Any,
                  owner: str) -> dict[str, np.ndarray]:
    """`{file name: host array}` of the model's arrays (NNX rng state left out): renamed by
    `mapping` (None drops one), those whose model name matches `transpose` transposed, floats cast
    to `dtype` (None: as they are). Arrays sharded over several processes are gathered first."""
    from jax.experimental import multihost_utils

    rename = WeightsLoad(None, mapping, transpose, True, owner)  # the same renaming and layout rules
    skip = rng_names(variables)
    arrays: dict[str, np.ndarray] = {}
    for name, leaf in _named(variables, None, keep=True)[0].items():
        new = rename._rename(name)
        if name in skip or new is None:
            continue
        if new in arrays:
            raise ValueError(f"{owner}.save_weights(mapping=...): {new!r} is the name of two arrays; map "
                             "each array of the model to a name of its own.")
        if not getattr(leaf, "is_fully_addressable", True):
            leaf = multihost_utils.process_allgather(leaf, tiled=True)
        array = np.asarray(jax.device_get(leaf))
        perm = rename._perm(name, array.ndim)
        array = array if perm is None else array.transpose(np.argsort(perm))
        if dtype is not None and jax.dtypes.issubdtype(array.dtype, np.floating):
            array = array.astype(dtype)
        arrays[new] = np.ascontiguousarray(array)
    return arrays


def flat_arrays(variables: tuple[PyTree, PyTree]) -> dict[str, Any]:
    """`{name: array}` of `(params, model_state)` under the names `load_weights` uses."""
    return _named(variables, None, keep=True)[0]


def target_names(variables: tuple[PyTree, PyTree]) -> dict[str, jax.ShapeDtypeStruct]:
    """The model's arrays by name, as `plan` takes them."""
    return _named(variables, None)[0]


def _named(variables, shardings, *, keep: bool = False):
    """`({name: ShapeDtypeStruct with sharding (or the array itself, keep)}, [names in leaf
    order], treedef)` of `(params, model_state)`; model_state's names are prefixed by nothing
    (Linen's carry their collection, NNX's their attribute path)."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(variables)
    flat_shardings = jax.tree.leaves(shardings) if shardings is not None else [None] * len(flat)
    named, order = {}, []
    for (path, leaf), sharding in zip(flat, flat_shardings):
        name = ".".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path[1:])
        order.append(name)
        named[name] = leaf if keep else jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding)
    return named, order, treedef


def rng_names(variables: tuple[PyTree, PyTree]) -> frozenset[str]:
    """NNX rng streams' keys and counters in `model_state`: never expected from outside."""
    targets = target_names(variables)
    keys = {name for name, t in targets.items() if jax.dtypes.issubdtype(t.dtype, jax.dtypes.prng_key)}
    counts = {name.rsplit(".", 1)[0] + ".count" for name in keys}
    return frozenset(keys | (counts & set(targets)))


def _castable(source: Any, target: Any) -> bool:
    """Floats load into any float dtype (bf16 files into an f32 model); other dtypes only as they are."""
    source, target = np.dtype(source), np.dtype(target)
    floats = lambda d: jax.dtypes.issubdtype(d, np.floating)  # noqa: E731 (bf16/fp8 included)
    return source == target or (floats(source) and floats(target))


def _transpose_rules(transpose: Transpose, owner: str) -> dict[str, Sequence[int] | None]:
    if isinstance(transpose, str):
        return {transpose: None}
    if isinstance(transpose, Mapping):
        return dict(transpose)
    if isinstance(transpose, Sequence) and all(isinstance(t, str) for t in transpose):
        return {t: None for t in transpose}
    raise TypeError(f"{owner}.load_weights(transpose=...) must be a regex, a list of regexes (their arrays' axes "
                    f"reversed) or a dict {{regex: axis order}}; got {transpose!r}.")


def _compile(pattern: str, where: str) -> None:
    try:
        re.compile(pattern)
    except re.error as error:
        raise ValueError(f"{where}: {pattern!r} is not a regular expression ({error}).") from None


def _examples(named: Mapping[str, Any]) -> str:
    names = list(named)[:3]
    return ", ".join(map(repr, names)) + (", ..." if len(named) > 3 else "") if names else "(none)"


@dataclasses.dataclass(frozen=True)
class RestoredWith:
    """`LitModule.load_from_checkpoint(path, **overrides)` of a Linen model: its weights are
    placed at the first build, where a mismatch is explained in these terms."""

    owner: str
    path: str
    overrides: Mapping[str, Any]
    saved: Mapping[str, Any]

    def explain(self, error: ValueError) -> str:
        """The message for a `WeightsLoad.plan` error: the arrays that differ, the overrides."""
        problems = [line.replace(" in the source", " in the checkpoint") for line in str(error).splitlines()
                    if line.startswith("  ")]
        given = ", ".join(f"{k}={v!r}" for k, v in self.overrides.items())
        changed = ", ".join(f"{k}: {self.saved.get(k, '(none)')!r} -> {v!r}" for k, v in self.overrides.items())
        shown = "\n".join(problems)
        return (f"{self.owner}.load_from_checkpoint({self.path!r}, {given}) builds a model the checkpoint's "
                f"weights do not fit ({changed}):\n{shown}\nLoad it without the hyperparameters that change "
                f"the model's shapes; a model of other shapes starts from its own initial values: "
                f"`{self.owner}({given})`.")
