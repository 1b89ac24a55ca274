"""Which dimension of each array an FSDP mesh axis splits: Flax annotations first, then a size rule.

The default rule (big_vision's and openpi's): shard an array's largest dimension that the axis
size divides; replicate scalars, vectors and arrays under a size threshold, whose all-gather
would cost more than the memory it saves. A Flax annotation (`nn.with_partitioning`, logical
names, NNX `sharding` metadata) overrides the rule for its parameter, and for the optimizer-state
leaves that mirror that parameter (Adam's `mu`/`nu` share its path and shape).

Tensor parallelism is the same mechanism on a second axis: a rule maps a logical name to the
`tensor` mesh axis (`{"heads": "tensor", "mlp": "tensor"}`), and the annotated dimension is split
over it. The rule for unannotated arrays only ever uses the `fsdp` axis.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import numpy as np
from jax.sharding import Mesh, PartitionSpec as P

from fitjax._typing import PyTree

#: `{("params", "Dense_0", "kernel"): ("embed", None), ...}`: names per dimension, from Flax metadata
Annotations = Mapping[tuple[str, ...], tuple]


def key_name(entry: Any) -> str:
    """One entry of a jax key path as a plain string (dict key, attribute or index)."""
    for attr in ("key", "name", "idx"):
        if hasattr(entry, attr):
            return str(getattr(entry, attr))
    return str(entry)


def path_names(path: tuple) -> tuple[str, ...]:
    return tuple(key_name(e) for e in path)


def default_spec(shape: tuple[int, ...], *, axis: str, axis_size: int, min_size: int) -> P:
    """`axis` on the largest dimension it divides; replicated when small, rank < 2 or no fit."""
    if axis_size == 1 or len(shape) < 2 or int(np.prod(shape)) < min_size:
        return P()
    fits = [(-dim, i) for i, dim in enumerate(shape) if dim % axis_size == 0]
    if not fits:
        return P()
    _, chosen = min(fits)
    return P(*[axis if i == chosen else None for i in range(len(shape))])


def _mesh_axes(name: Any, mesh: Mesh, rules: Mapping[str, Any], where: str) -> tuple[str, ...]:
    """The mesh axes a logical (or mesh) axis name stands for; () replicates."""
    if name is None:
        return ()
    if isinstance(name, (tuple, list)):
        return tuple(a for n in name for a in _mesh_axes(n, mesh, rules, where))
    if name in rules:
        target = rules[name]
        return () if target is None else ((target,) if isinstance(target, str) else tuple(target))
    if name in mesh.axis_names:
        return (name,)
    raise ValueError(
        f"{where} is annotated with the axis name {name!r}, which is neither a mesh axis "
        f"{tuple(mesh.axis_names)} nor a key of FSDP(rules=...) {sorted(rules)}. Map it, e.g. "
        f"`FSDP(rules={{{name!r}: 'fsdp'}})`, or to None to replicate that dimension."
    )


def annotated_spec(names: tuple, shape: tuple[int, ...], mesh: Mesh, rules: Mapping[str, Any],
                   where: str) -> P:
    """A Flax annotation resolved to mesh axes, checked against the array's shape."""
    if len(names) != len(shape):
        raise ValueError(
            f"{where} has shape {shape} but its sharding annotation {tuple(names)} names "
            f"{len(names)} dimensions; give one name (or None) per dimension."
        )
    entries, used = [], {}
    for dim, name in zip(shape, names):
        axes = _mesh_axes(name, mesh, rules, where)
        for axis in axes:
            if axis not in mesh.axis_names:
                raise ValueError(
                    f"FSDP(rules=...) maps {where}'s axis {name!r} to {axis!r}, which is not a mesh "
                    f"axis; use one of {tuple(mesh.axis_names)} or None."
                )
            if axis in used and mesh.shape[axis] > 1:
                raise ValueError(
                    f"{where}'s annotation {tuple(names)} puts mesh axis {axis!r} on two dimensions "
                    f"({used[axis]!r} and {name!r}); an array is split over an axis once. Map one "
                    "of these names to None or to another axis in FSDP(rules=...)."
                )
        # an axis of size 1 splits nothing: a second use of it (say `tensor` on a mesh without
        # tensor parallelism) is dropped instead of making an invalid PartitionSpec
        axes = tuple(a for a in axes if a not in used)
        used.update({a: name for a in axes})
        split = int(np.prod([mesh.shape[a] for a in axes]))
        if dim % split:
            raise ValueError(
                f"{where} has a dimension of size {dim} annotated {name!r} -> mesh axes {axes} of "
                f"{split} devices, which does not divide it. Change the annotation, map {name!r} to "
                "None in FSDP(rules=...), or use a mesh whose axis divides it."
            )
        entries.append(None if not axes else (axes[0] if len(axes) == 1 else axes))
    return P(*entries)


def fsdp_specs(abstract_state: PyTree, mesh: Mesh, *, axis: str, min_size: int,
               rules: Mapping[str, Any], annotations: Annotations) -> PyTree:
    """A `PartitionSpec` for every leaf of a train state (same tree structure)."""
    leaves, treedef = jax.tree_util.tree_flatten_with_path(abstract_state)
    by_param = {  # optimizer (and step-piece) leaves that mirror a parameter end with its path
        path[1:]: names for path, names in annotations.items() if path[:1] == ("params",)
    }
    specs = []
    for path, leaf in leaves:
        names = path_names(path)
        shape = tuple(leaf.shape)
        where = "/".join(names)
        found = annotations.get(names)
        if found is None and names[:1] in (("opt_state",), ("extras",)):  # extras: EMA, ...
            found = next((by_param[names[i:]] for i in range(1, len(names))
                          if names[i:] in by_param and len(by_param[names[i:]]) == len(shape)), None)
        if found is not None:
            specs.append(annotated_spec(found, shape, mesh, rules, where))
        else:
            specs.append(default_spec(shape, axis=axis, axis_size=mesh.shape[axis], min_size=min_size))
    return jax.tree_util.tree_unflatten(treedef, specs)
