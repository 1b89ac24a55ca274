"""On-device metric accumulators, read on the host rarely.

An accumulator is `{name: entry}`. A mean's entry is `float32[2]` holding
`(sum of value * weight, sum of weight)`, where the weight is the number of examples a value stands
for. A stateful metric's entry (`F1Score`, `AUROC`, a clu or metrax metric) is a `Tracked`: the
examples merged so far and the metric holding their merged state. Updating either is a few adds
inside the jitted step; reading one (`compute`) is the only host sync, done at log time for every
name in one transfer.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from fitjax._typing import HostMetrics
from fitjax.metrics._base import Metric, is_metric

__all__ = ["Saved", "Tracked", "add", "compute", "compute_values", "empty_like", "examples_seen", "from_plain", "has_weight",
           "merge_host", "template_of", "to_plain", "zeros"]

Accumulator = dict[str, Any]


@jax.tree_util.register_pytree_node_class
class Tracked:
    """A stateful metric's accumulator entry: `count` (float32: the examples merged) and `metric`
    (the metric holding their merged state; before any, zeros shaped like it)."""

    def __init__(self, count: Any, metric: Any) -> None:
        self.count, self.metric = count, metric

    def tree_flatten(self):
        return (self.count, self.metric), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)

    def __repr__(self) -> str:
        return f"Tracked(count={self.count!r}, metric={self.metric!r})"


def empty_like(metric: Any, *, host: bool = False) -> Tracked:
    """An empty entry for a metric shaped like `metric` (an abstract or concrete metric state);
    `host=True`: numpy zeros (see `zeros`)."""
    xp = np if host else jnp
    zeros = jax.tree.map(lambda x: xp.zeros(x.shape, x.dtype), metric)
    return Tracked(xp.zeros((), xp.float32), zeros)


def zeros(names: Iterable[str] | Mapping[str, Any], *, host: bool = False) -> Accumulator:
    """An empty accumulator: `names` are means, or a mapping `name -> None` (a mean) or `name ->
    metric` (a state shaped like it; abstract `ShapeDtypeStruct` leaves are enough).

    `host=True` makes numpy zeros, to be placed on the devices without a program: outside a
    trace each `jnp.zeros` shape compiles one (~20 ms on CPU, more on an accelerator)."""
    xp = np if host else jnp
    templates = names if isinstance(names, Mapping) else dict.fromkeys(names)
    return {name: xp.zeros((2,), xp.float32) if template is None else empty_like(template, host=host)
            for name, template in templates.items()}


def add(acc: Accumulator, values: Mapping[str, Any], weight: jax.Array | float | Mapping[str, Any]
        ) -> Accumulator:
    """Adds `values` (scalars, or one value per example when `weight` is a vector; metrics: one
    batch's state, or one state per example stacked on a leading axis when `weight` is a vector).
    `weight` may be a mapping `name -> weight`, one per entry (a token loss weighs its tokens)."""
    weights = weight if isinstance(weight, Mapping) else None
    out = {}
    for name, total in acc.items():
        weight = jnp.asarray(weights[name] if weights is not None else weight, jnp.float32)
        if isinstance(total, Tracked):
            out[name] = _add_state(total, values[name], weight)
            continue
        value = jnp.asarray(values[name], jnp.float32)
        if weight.ndim:  # per-example values with a mask: padding rows weigh 0
            out[name] = total + jnp.stack([jnp.sum(value * weight), jnp.sum(weight)])
        else:
            out[name] = total + jnp.stack([value * weight, weight])
    return out


def _add_state(total: Tracked, value: Any, weight: jax.Array) -> Tracked:
    # a foreign metric may hold a Python number among its fields (metrax's AUCROC holds
    # `num_thresholds: int`): an array like the state's own leaf, so the entry keeps one structure
    value = jax.tree.map(jnp.asarray, value)
    if weight.ndim:  # one state per example: merged over the real rows first
        keep = weight > 0
        value = value.reduce_rows(keep) if isinstance(value, Metric) else _reduce_rows(value, keep)
        weight = weight.sum()
    had = total.count > 0
    merged = _select(had, total.metric.merge(value), value)
    return Tracked(total.count + weight, _select(weight > 0, merged, total.metric))


def _select(condition: jax.Array, new: Any, old: Any) -> Any:
    return jax.tree.map(lambda n, o: jnp.where(condition, n, o).astype(o.dtype), new, old)


def _reduce_rows(stacked: Any, keep: jax.Array) -> Any:
    """The merge of a foreign metric's states stacked on a leading axis, rows with `keep` False
    left out: a tree of pairwise merges, log2(rows) vectorised levels."""
    rows = keep.shape[0]
    seen = keep
    while rows > 1:
        if rows % 2:  # an odd row out: pair it with an unseen copy of the first
            stacked = jax.tree.map(lambda x: jnp.concatenate([x, x[:1]]), stacked)
            seen = jnp.concatenate([seen, jnp.zeros((1,), bool)])
            rows += 1
        a = jax.tree.map(lambda x: x[0::2], stacked)
        b = jax.tree.map(lambda x: x[1::2], stacked)
        sa, sb = seen[0::2], seen[1::2]
        merged = jax.vmap(lambda x, y: x.merge(y))(a, b)
        both = jax.vmap(lambda c, m, x, y: _select(c[0], m, _select(c[1], x, y)))(
            jnp.stack([sa & sb, sa], -1), merged, a, b)
        stacked, seen, rows = both, sa | sb, rows // 2
    return jax.tree.map(lambda x: x[0], stacked)


def examples_seen(acc: Mapping[str, Any]) -> jax.Array:
    """How many examples the accumulator merged (traced; 0 when it holds nothing)."""
    for entry in acc.values():
        return entry.count if isinstance(entry, Tracked) else entry[1]
    return jnp.zeros((), jnp.float32)


def has_weight(acc: Mapping[str, Any]) -> bool:
    """Whether any entry of a host accumulator merged an example."""
    return any(float(e.count if isinstance(e, Tracked) else e[1]) > 0 for e in acc.values())


class Saved:
    """A metric entry read back from plain data (`to_plain`), waiting for the structure of the
    next entry of its name (`merge_host`) to become a `Tracked` again, bitwise."""

    def __init__(self, plain: Mapping[str, Any]) -> None:
        self.plain = plain

    def like(self, other: Tracked) -> Tracked:
        leaves, tree = jax.tree.flatten(other)
        saved = self.plain["leaves"]
        if len(saved) != len(leaves):
            raise ValueError(f"a saved metric state has {len(saved)} arrays, the module's has {len(leaves)}: "
                             "the checkpoint was written by a module with other metrics.")
        return jax.tree.unflatten(tree, [np.asarray(v, np.dtype(d)).reshape(np.shape(leaf))
                                         for v, d, leaf in zip(saved, self.plain["dtypes"], leaves)])


def to_plain(entry: Any) -> Any:
    """An accumulator entry as JSON data, bitwise (a mean: 2 float64; a metric: its arrays)."""
    if isinstance(entry, Saved):
        return dict(entry.plain)
    if isinstance(entry, Tracked):
        leaves = jax.tree.leaves(entry)
        return {"leaves": [np.asarray(x).astype(np.float64).tolist() for x in leaves],
                "dtypes": [str(np.asarray(x).dtype) for x in leaves]}
    return np.asarray(entry, np.float64).tolist()


def from_plain(plain: Any) -> Any:
    """What `to_plain` wrote (a metric's state as `Saved` until merged with a window's)."""
    return Saved(plain) if isinstance(plain, Mapping) else np.asarray(plain, np.float64)


def merge_host(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """Merges two host accumulators (e.g. an epoch total and the window just fetched): means are
    summed in float64, metric states merged with their `merge`."""
    out = {}
    for k in {*a, *b}:
        x, y = a.get(k), b.get(k)
        if type(x) is np.ndarray and type(y) is np.ndarray:  # two means (every name but a metric's)
            out[k] = np.add(x, y, dtype=np.float64)  # the float64 sum of both cast: the same bits
            continue
        if isinstance(x, Saved) and isinstance(y, Tracked):
            x = x.like(y)
        if isinstance(x, Tracked) or isinstance(y, Tracked):
            out[k] = _merge_tracked(x, y)
        else:
            out[k] = np.asarray(0.0 if x is None else x, np.float64) + np.asarray(0.0 if y is None else y, np.float64)
    return out


def _merge_tracked(x: Tracked | None, y: Tracked | None) -> Tracked:
    if x is None or not float(x.count) > 0:
        return y if y is not None else x
    if y is None or not float(y.count) > 0:
        return x
    return Tracked(np.float64(x.count) + np.float64(y.count), jax.device_get(x.metric.merge(y.metric)))


def compute(acc: Mapping[str, Any]) -> HostMetrics:
    """Weighted means of a host accumulator; names with no weight yet are left out. Metric
    entries are left out too: see `compute_values`."""
    return {name: float(entry[0] / entry[1]) for name, entry in acc.items()
            if not isinstance(entry, (Tracked, Saved)) and entry[1] > 0}


def compute_values(acc: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The computed value of each metric entry that merged any example (host numpy arrays: a
    scalar, a vector of per-class numbers, or a matrix)."""
    return {name: np.asarray(jax.device_get(_computed(entry.metric)))
            for name, entry in acc.items() if isinstance(entry, Tracked) and float(entry.count) > 0}


@jax.jit
def _jitted_compute(metric: Any) -> Any:
    return metric.compute()


def _computed(metric: Any) -> Any:
    """`metric.compute()` as one program, compiled once per metric and shape in a process: called
    op by op, an AUROC's or an F1's value compiles each of its dozens of operations on its first
    read, and on an accelerator dispatches each of them at every read. A metric jit cannot trace
    (configuration that is not hashable, a value read or a slice sized on the host inside
    `compute`, as some metrax metrics do) is computed as it is, from then on without trying."""
    if type(metric) not in _UNTRACEABLE:
        try:
            return _jitted_compute(metric)
        except Exception:  # noqa: BLE001  (the call as it is raises whatever is really wrong)
            _UNTRACEABLE.add(type(metric))
    return metric.compute()


_UNTRACEABLE: set[type] = set()


def template_of(value: Any) -> Any:
    """What `zeros` needs for a step value: None for a mean, the metric for a stateful one."""
    return value if is_metric(value) else None
