"""Checkpoints of the trained part: a LoRA fit's adapters, their optimizer state and the loop
position, without the frozen base (`ModelCheckpoint(weights="trainable")`).

A fit whose optimizer freezes parameters (`LitModule.apply_lora`'s base, a `fj.param_groups`
group given None) never changes them, so a checkpoint need not hold them: the resume takes them
from the state the run built (the same `load_weights` source). What the checkpoint keeps of the
frozen part is a fingerprint per array, so that a resume onto other base weights (another file,
or none loaded: the random initialisation) fails naming the array instead of continuing a fit
from a model it never was.

The fingerprint is computed on the devices, in the arrays' own shardings: two wrapping uint32
sums of each array's bits (plain, and weighted by the element's position), exact and the same
under any strategy, since integer addition is associative. It costs one read of the frozen
weights per fit (the first save, and the resume), no host copy.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fitjax._typing import PyTree

__all__ = ["FROZEN_KEY", "check_frozen", "fingerprints", "keep_trained", "merge_trained"]

FROZEN_KEY = "frozen_fingerprints"  # in a checkpoint's meta: {array name: [sum, weighted sum]}


def _name(path: tuple) -> str:
    return ".".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)


def _split(params: PyTree, mask: PyTree) -> tuple[dict[str, Any], dict[str, Any]]:
    """`({name: array} trained, {name: array} frozen)` by the trainable mask (True: trains)."""
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    flags = jax.tree.leaves(mask)
    if len(flags) != len(leaves):
        raise ValueError(f"the trainable mask has {len(flags)} entries for {len(leaves)} parameters.")
    trained, frozen = {}, {}
    for (path, leaf), trains in zip(leaves, flags):
        (trained if trains else frozen)[_name(path)] = leaf
    return trained, frozen


@jax.jit
def _digest(arrays: dict[str, jax.Array]) -> dict[str, jax.Array]:
    def one(x):
        bits = jax.lax.bitcast_convert_type(x, jnp.dtype(f"uint{x.dtype.itemsize * 8}")).ravel()
        bits = bits.astype(jnp.uint32)  # 64-bit arrays: their low halves (enough to tell weights apart)
        weight = jnp.arange(bits.size, dtype=jnp.uint32) * jnp.uint32(2654435761) + jnp.uint32(1)
        return jnp.stack([bits.sum(dtype=jnp.uint32), (bits * weight).sum(dtype=jnp.uint32)])

    return {name: one(x) for name, x in arrays.items()}


def fingerprints(params: PyTree, mask: PyTree) -> dict[str, list[int]]:
    """`{name: [sum, weighted sum]}` of each frozen parameter's bits (a host sync: one small read)."""
    frozen = _split(params, mask)[1]
    return {name: [int(v) for v in np.asarray(d)] for name, d in jax.device_get(_digest(frozen)).items()}


def keep_trained(state: Any, mask: PyTree) -> Any:
    """`state` whose `params` are the trained ones alone, as a nested dict by name (the frozen
    ones left out: what a trainable-only checkpoint holds)."""
    return dataclasses.replace(state, params=_nest(_split(state.params, mask)[0]))


def merge_trained(params: PyTree, restored: PyTree) -> PyTree:
    """`params` with each trained array replaced by the restored one (`keep_trained`'s tree)."""
    flat = {_name(p): leaf for p, leaf in jax.tree_util.tree_flatten_with_path(restored)[0]}
    return jax.tree_util.tree_map_with_path(lambda p, x: flat.get(_name(p), x), params)


def check_frozen(saved: dict[str, list[int]], params: PyTree, mask: PyTree | None, where: str) -> None:
    """Raises a `ValueError` naming the frozen arrays of this run that are not those the
    checkpoint's fit trained against (other base weights, or none loaded)."""
    fix = ("Load the base weights the fit started from before resuming (`module.load_weights(source)`, "
           "then `apply_lora(...)` as before), or resume from a checkpoint saved with "
           "ModelCheckpoint(weights='all'), which holds them.")
    if mask is None:
        raise ValueError(f"{where} holds only the trained parameters (ModelCheckpoint(weights='trainable')), "
                         "and this run's optimizer trains every parameter, so there is no frozen base to take "
                         f"the rest from. Resume with the adapters or frozen groups it was saved with. {fix}")
    ours = fingerprints(params, mask)
    missing = sorted(set(saved) - set(ours))
    if missing:
        raise ValueError(f"{where} was trained against frozen parameters this run trains or lacks: {missing[:5]}"
                         f"{' ...' if len(missing) > 5 else ''}. Resume with the adapters or frozen groups it was "
                         "saved with.")
    differ = sorted(name for name in saved if list(saved[name]) != ours[name])
    if differ:
        raise ValueError(f"{where} holds only the trained parameters, and this run's frozen base weights are "
                         f"not the ones they were trained against: {differ[:5]}{' ...' if len(differ) > 5 else ''} "
                         f"({len(differ)} of {len(saved)} frozen arrays differ). {fix}")


def _nest(flat: dict[str, Any]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for name, leaf in flat.items():
        *parents, last = name.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = leaf
    return tree
