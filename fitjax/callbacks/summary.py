"""`RichModelSummary`: a table of the model's arrays when fit starts, for Linen and NNX alike.

Both kinds of model reach the trainer as two nested dicts (`params`, `model_state`), so the
summary walks those: one row per array (or per module with `max_depth`), with its shape, element
count, bytes and, on a mesh of several devices, how it is split and what one device holds. It
reads only array metadata (shape, dtype, sharding): no transfer, no wait for the device.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Sequence
from typing import Any, TextIO

import jax
from jax.sharding import NamedSharding
from flax import nnx
from flax.nnx import variablelib
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from fitjax.module import unwrap_host_model
from fitjax._typing import PyTree
from fitjax.callbacks._base import Callback

__all__ = ["ModelSummary", "RichModelSummary", "summarize"]


@dataclasses.dataclass(frozen=True)
class SummaryRow:
    module: str  # the path of dict keys above the array ("Encoder_0/Dense_1"), or "" at the top
    name: str  # the array's key, or "" for a row that sums a module's arrays
    collection: str  # "params", or the model-state collection ("batch_stats", NNX "rngs", ...)
    shape: tuple[int, ...] | None
    dtype: str
    count: int
    nbytes: int
    sharding: str | None = None  # the partition spec when the mesh has several devices
    device_bytes: int | None = None  # what one device holds of it


@dataclasses.dataclass(frozen=True)
class ModelSummary:
    """What `RichModelSummary` shows: the rows and the totals of trainable and other arrays."""

    rows: list[SummaryRow]
    trainable_count: int
    trainable_bytes: int
    other_count: int
    other_bytes: int
    sharded: bool

    @property
    def total_count(self) -> int:
        return self.trainable_count + self.other_count

    @property
    def total_bytes(self) -> int:
        return self.trainable_bytes + self.other_bytes


def _spec(array: Any) -> tuple[str | None, int | None]:
    sharding = getattr(array, "sharding", None)
    if not isinstance(sharding, NamedSharding) or sharding.mesh.size <= 1:
        return None, None
    parts = [("+".join(p) if isinstance(p, tuple) else p) if p is not None else "-" for p in sharding.spec]
    spec = "replicated" if all(p == "-" for p in parts) else f"({', '.join(parts)})"
    per_device = math.prod(sharding.shard_shape(array.shape)) * array.dtype.itemsize
    return spec, per_device


def _rows(tree: PyTree, collection: str) -> list[SummaryRow]:
    rows = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if not hasattr(leaf, "shape"):
            continue
        keys = [str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path]
        spec, per_device = _spec(leaf)
        rows.append(SummaryRow(
            module="/".join(keys[:-1]), name=keys[-1] if keys else "", collection=collection,
            shape=tuple(leaf.shape), dtype=str(leaf.dtype), count=math.prod(leaf.shape),
            nbytes=int(leaf.nbytes), sharding=spec, device_bytes=per_device,
        ))
    return rows


def _in_order(rows: list[SummaryRow], order: Sequence[tuple[str, ...]]) -> list[SummaryRow]:
    """`rows` sorted by where their path comes in `order` (a stable sort: unknown paths last)."""
    if not order:
        return rows
    place = {path: i for i, path in enumerate(order)}
    return sorted(rows, key=lambda row: place.get((*filter(None, row.module.split("/")), row.name), len(place)))


def _group(rows: list[SummaryRow], depth: int) -> list[SummaryRow]:
    groups: dict[tuple[str, str], list[SummaryRow]] = {}
    for row in rows:
        key = ("/".join([*row.module.split("/"), row.name][:depth]).strip("/"), row.collection)
        groups.setdefault(key, []).append(row)
    out = []
    for (module, collection), members in groups.items():
        if len(members) == 1:
            out.append(members[0])
            continue
        dtypes = sorted({m.dtype for m in members})
        per_device = [m.device_bytes for m in members]
        out.append(SummaryRow(
            module=module, name="", collection=collection, shape=None, dtype=", ".join(dtypes),
            count=sum(m.count for m in members), nbytes=sum(m.nbytes for m in members),
            sharding=None, device_bytes=sum(per_device) if None not in per_device else None,
        ))
    return out


def _nnx_kinds(model: Any) -> dict[tuple[str, ...], str] | None:
    """`{path: kind}` of an NNX model's variables, or None for another model.

    The kind is the Linen collection name NNX registers for the variable's type ("batch_stats"
    for `BatchStat`), else the type's name ("RngCount"): the state reaches the trainer as plain
    dicts whose first key is the submodule, not the kind."""
    if not isinstance(model, nnx.Module):
        return None
    kinds = {}
    for path, variable in nnx.to_flat_state(nnx.state(model)):
        kind = getattr(variable, "type", type(variable))
        try:
            name = variablelib.variable_name_from_type(kind)
        except ValueError:  # not registered (rng counters and keys, user types)
            name = kind.__name__
        kinds[tuple(str(p) for p in path)] = name
    return kinds


def _state_rows(model_state: PyTree, kinds: dict[tuple[str, ...], str] | None) -> list[SummaryRow]:
    """Rows of the model state: `{collection: tree}` (Linen), or module paths whose kinds are
    looked up in `kinds` (NNX)."""
    if kinds is None:
        return [row for name, tree in (model_state or {}).items() for row in _rows(tree, str(name))]
    rows = _rows(model_state or {}, "state")
    return [dataclasses.replace(row, collection=kinds.get((*row.module.split("/"), row.name), "state"))
            if row.module else dataclasses.replace(row, collection=kinds.get((row.name,), "state"))
            for row in rows]


def summarize(params: PyTree, model_state: PyTree, *, max_depth: int | None = None,
              model: Any = None, order: Sequence[tuple[str, ...]] = (), trains: PyTree = None) -> ModelSummary:
    """Rows and totals for a model's `params` and `model_state` (nested dicts of arrays).

    Args:
        params: the trainable arrays.
        model_state: the other arrays: `{collection: tree}` for Linen (`batch_stats`, ...);
            for an NNX model (pass `model`), a tree by submodule, as the trainer keeps it.
        max_depth: sum the rows of each module at this depth of the path (None: every array).
        model: the `flax.nnx.Module` the state belongs to, so that each state row shows its
            submodule and its kind (`batch_stats`, `RngCount`, ...); ignored for Linen.
        order: the arrays' paths in the model's own order (`LitModule.variable_order`): the rows
            follow it (trainable arrays first); default the keys' sorted order.
        trains: a tree of bools like `params`, False where the optimizer freezes the parameter
            (`LitModule.trainable_mask`: LoRA's base, `param_groups`' frozen groups): those rows
            are of kind `frozen` and counted with the other arrays. None: every parameter trains.

    Example:
        >>> import jax.numpy as jnp
        >>> s = summarize({"Dense_0": {"kernel": jnp.zeros((3, 4)), "bias": jnp.zeros(4)}}, {})
        >>> s.trainable_count, s.trainable_bytes
        (16, 64)
    """
    if trains is None:
        trainable, frozen = _rows(params, "params"), []
    else:  # the two parts of params, each with None where the other's arrays are
        trainable = _rows(jax.tree.map(lambda p, t: p if t else None, params, trains), "params")
        frozen = _rows(jax.tree.map(lambda p, t: None if t else p, params, trains), "frozen")
    trainable = _in_order(trainable, order)
    other = _in_order(frozen + _state_rows(model_state, _nnx_kinds(model)), order)
    rows = trainable + other
    if max_depth is not None:
        rows = _group(rows, max_depth)
    return ModelSummary(
        rows=rows,
        trainable_count=sum(r.count for r in trainable), trainable_bytes=sum(r.nbytes for r in trainable),
        other_count=sum(r.count for r in other), other_bytes=sum(r.nbytes for r in other),
        sharded=any(r.sharding is not None for r in trainable + other),
    )


def _human(n: float, unit: str = "") -> str:
    for suffix in ("", " K", " M", " B", " T"):
        if abs(n) < 1000:
            return f"{n:.3g}{suffix}{unit}" if suffix else f"{int(n)}{unit}"
        n /= 1000
    return f"{n:.3g} P{unit}"


def _bytes(n: int | None) -> str:
    if n is None:
        return ""
    for suffix in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or suffix == "TiB":
            return f"{n:.4g} {suffix}" if suffix != "B" else f"{n} B"
        n /= 1024
    raise AssertionError("unreachable")


def totals(summary: ModelSummary) -> str:
    """The one-line totals printed under the table."""
    return (
        f"Trainable params: {_human(summary.trainable_count)} ({_bytes(summary.trainable_bytes)})  "
        f"Other state: {_human(summary.other_count)} ({_bytes(summary.other_bytes)})  "
        f"Total: {_human(summary.total_count)} ({_bytes(summary.total_bytes)})"
    )


def render(summary: ModelSummary, *, title: str = "Model summary") -> Group:
    """A rich table of `summary` and its totals line (a line of its own: a caption would wrap
    at the table's width, which is often narrower than the line)."""
    table = Table(title=title, title_justify="left", show_edge=False)
    for header, justify in (("Module", "left"), ("Array", "left"), ("Kind", "left"), ("Shape", "left"),
                            ("Dtype", "left"), ("Count", "right"), ("Bytes", "right")):
        table.add_column(header, justify=justify)
    if summary.sharded:
        table.add_column("Sharding", justify="left")
        table.add_column("Per device", justify="right")
    for row in summary.rows:
        cells = [row.module or "-", row.name, row.collection,
                 "" if row.shape is None else str(list(row.shape)), row.dtype,
                 f"{row.count:,}", _bytes(row.nbytes)]
        if summary.sharded:
            cells += [row.sharding or "", _bytes(row.device_bytes)]
        table.add_row(*cells)
    return Group(table, Text(totals(summary), no_wrap=True, overflow="ignore"))


class RichModelSummary(Callback):
    """Prints a table of the model's arrays when `fit` starts (on by default: `enable_model_summary`).

    One row per array of the parameters and the model state (BatchNorm statistics, NNX rng
    counters): module path, kind (`params`, `batch_stats`, ...), shape, dtype, element count and
    bytes, then a line of totals; on a mesh of several devices also each array's partition spec
    and the bytes one device holds.

    Args:
        max_depth: sum the rows of each module at this depth of the path (None: every array).
        file: where to print (default stdout).
        console_kwargs: more arguments for the `rich.console.Console` it prints with, e.g.
            `{"width": 120}` or `{"record": True}` (read back with `summary.console.export_text()`).

    Example:
        >>> import fitjax as fj
        >>> trainer = fj.Trainer(callbacks=[fj.RichModelSummary(max_depth=1)])
    """

    def __init__(self, max_depth: int | None = None, *, file: TextIO | None = None,
                 console_kwargs: dict[str, Any] | None = None):
        if max_depth is not None and (not isinstance(max_depth, int) or isinstance(max_depth, bool)
                                      or max_depth < 1):
            raise ValueError(f"RichModelSummary(max_depth=...) must be None or an int >= 1, got {max_depth!r}")
        self.max_depth = max_depth
        self._file = file
        self._console_kwargs = dict(console_kwargs or {})
        self.console: Console | None = None  # the console of the last print
        self.summary: ModelSummary | None = None

    def on_fit_start(self, trainer, module) -> None:
        if not trainer.is_global_zero:
            return
        state = trainer.state
        # in a hook the module's model attribute calls the model with the current weights: the
        # flax model itself is behind it
        model = unwrap_host_model(getattr(module, "model", None))
        self.summary = summarize(state.params, state.model_state, max_depth=self.max_depth,
                                 model=model, order=module.variable_order,
                                 trains=module.trainable_mask(state.params))
        self.console = Console(**{"file": self._file or sys.stdout, **self._console_kwargs})
        if not self.console.is_terminal and "width" not in self._console_kwargs:
            self.console.width = max(self.console.width, 160)  # logs have no width: don't squash the table
        self.console.print(render(self.summary, title=f"{type(module).__name__} summary"), highlight=False)
