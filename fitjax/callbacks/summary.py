"""`RichModelSummary`: a table of the model's layers when fit starts, for Linen and NNX alike.

Both kinds of model reach the trainer as two nested dicts (`params`, `model_state`), so the
summary walks those: one row per layer (the module path down to `max_depth`, Lightning's rows),
with its parameter count, other state and bytes, or one row per array on request (`arrays=True`)
with its shape, dtype and, on a mesh of several devices, how it is split and what one device
holds. It reads only array metadata (shape, dtype, sharding): no transfer, no wait for the device.
The table is made to fit 80 columns: counts with units (`18.4 K`), types written as JAX does
(`float32[3,3,32]`), long names folded inside their cell rather than cut.
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
from fitjax.strategies import HOST

__all__ = ["LayerRow", "ModelSummary", "RichModelSummary", "summarize"]


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
class LayerRow:
    """A layer's arrays together: `name` is its module path down to the summary's depth."""

    name: str
    params: int  # trainable elements
    other: int  # elements of the model state (BatchNorm statistics, NNX rng counters)
    nbytes: int
    device_bytes: int | None = None  # what one device holds of them, on a mesh of several
    frozen: int = 0  # parameters the optimizer freezes (LoRA's base weights)


@dataclasses.dataclass(frozen=True)
class ModelSummary:
    """What `RichModelSummary` shows: the arrays (`rows`), the layers they group into
    (`layers`) and the totals of trainable and other arrays; `other_*` counts every array that
    does not train, `frozen_*` the frozen parameters among them (LoRA's base weights)."""

    rows: list[SummaryRow]
    trainable_count: int
    trainable_bytes: int
    other_count: int
    other_bytes: int
    sharded: bool
    layers: list[LayerRow] = dataclasses.field(default_factory=list)
    frozen_count: int = 0
    frozen_bytes: int = 0
    #: the optimizer state's bytes (None: not summarized) and where it lives between steps:
    #: "device" or "host" memory (`Trainer(offload=...)`); where the parameters live
    optimizer_bytes: int | None = None
    optimizer_memory: str = "device"
    params_memory: str = "device"

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


def _layers(rows: list[SummaryRow], depth: int) -> list[LayerRow]:
    """The arrays summed by module path down to `depth` (-1: the whole path), in the order their
    first array comes; an array at the top (no module) is a layer of its own."""
    groups: dict[str, list[SummaryRow]] = {}
    for row in rows:
        parts = row.module.split("/") if row.module else [row.name]
        groups.setdefault("/".join(parts if depth < 0 else parts[:depth]), []).append(row)
    out = []
    for name, members in groups.items():
        per_device = [m.device_bytes for m in members]
        out.append(LayerRow(
            name=name, params=sum(m.count for m in members if m.collection == "params"),
            other=sum(m.count for m in members if m.collection not in ("params", "frozen")),
            nbytes=sum(m.nbytes for m in members),
            device_bytes=sum(per_device) if None not in per_device else None,
            frozen=sum(m.count for m in members if m.collection == "frozen")))
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


def summarize(params: PyTree, model_state: PyTree, *, max_depth: int = 1,
              model: Any = None, order: Sequence[tuple[str, ...]] = (), trains: PyTree = None,
              opt_state: PyTree = None) -> ModelSummary:
    """Rows and totals for a model's `params` and `model_state` (nested dicts of arrays).

    Args:
        params: the trainable arrays.
        model_state: the other arrays: `{collection: tree}` for Linen (`batch_stats`, ...);
            for an NNX model (pass `model`), a tree by submodule, as the trainer keeps it.
        max_depth: `layers` sum the arrays of each module at this depth of the path
            (Lightning's `max_depth`: 1 the top-level layers, -1 every module whole).
        model: the `flax.nnx.Module` the state belongs to, so that each state row shows its
            submodule and its kind (`batch_stats`, `RngCount`, ...); ignored for Linen.
        order: the arrays' paths in the model's own order (`LitModule.variable_order`): the rows
            follow it (trainable arrays first); default the keys' sorted order.
        trains: a tree of bools like `params`, False where the optimizer freezes the parameter
            (`LitModule.trainable_mask`: LoRA's base, `param_groups`' frozen groups): those rows
            are of kind `frozen`, counted apart ("Frozen") and among the arrays that do not
            train. None: every parameter trains.
        opt_state: the optimizer state, summed on a line of its own with the memory it lives in
            between steps (None: no line).

    Example:
        >>> import jax.numpy as jnp
        >>> s = summarize({"Dense_0": {"kernel": jnp.zeros((3, 4)), "bias": jnp.zeros(4)}}, {})
        >>> s.trainable_count, s.trainable_bytes, s.layers[0].params
        (16, 64, 16)
    """
    if trains is None:
        trainable, frozen = _rows(params, "params"), []
    else:  # the two parts of params, each with None where the other's arrays are
        trainable = _rows(jax.tree.map(lambda p, t: p if t else None, params, trains), "params")
        frozen = _rows(jax.tree.map(lambda p, t: None if t else p, params, trains), "frozen")
    trainable = _in_order(trainable, order)
    other = _in_order(frozen + _state_rows(model_state, _nnx_kinds(model)), order)
    rows = trainable + other
    return ModelSummary(
        rows=rows, layers=_layers(rows, max_depth),
        trainable_count=sum(r.count for r in trainable), trainable_bytes=sum(r.nbytes for r in trainable),
        other_count=sum(r.count for r in other), other_bytes=sum(r.nbytes for r in other),
        sharded=any(r.sharding is not None for r in trainable + other),
        frozen_count=sum(r.count for r in frozen), frozen_bytes=sum(r.nbytes for r in frozen),
        optimizer_bytes=None if opt_state is None else sum(int(x.nbytes) for x in jax.tree.leaves(opt_state)
                                                           if hasattr(x, "nbytes")),
        optimizer_memory=_memory(opt_state), params_memory=_memory(params),
    )


def _memory(tree: PyTree) -> str:
    """"host" when every array of `tree` lives in host memory between steps, else "device"."""
    kinds = {getattr(getattr(x, "sharding", None), "memory_kind", None) for x in jax.tree.leaves(tree)}
    return "host" if kinds == {HOST} else "device"


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


def totals(summary: ModelSummary) -> list[str]:
    """The totals printed under the table, one a line (Lightning's lines, with bytes): frozen
    parameters (LoRA's base) on a line of their own where there are any."""
    on_host = ", in host memory" if summary.params_memory == "host" else ""
    lines = [f"{_human(summary.trainable_count):<9} Trainable params ({_bytes(summary.trainable_bytes)}{on_host})"]
    state_count = summary.other_count - summary.frozen_count
    if summary.frozen_count:
        lines.append(f"{_human(summary.frozen_count):<9} Frozen params ({_bytes(summary.frozen_bytes)})")
    if state_count or not summary.frozen_count:
        lines.append(f"{_human(state_count):<9} Other state ({_bytes(summary.other_bytes - summary.frozen_bytes)})")
    lines.append(f"{_human(summary.total_count):<9} Total ({_bytes(summary.total_bytes)})")
    if summary.optimizer_bytes is not None:  # not among the model's arrays: a line of its own
        lines.append(f"{'':<9} Optimizer state ({_bytes(summary.optimizer_bytes)}, in {summary.optimizer_memory} memory)")
    return lines


def _typed_shape(row: SummaryRow) -> str:
    """JAX's notation of an array's type: `float32[3,3,32]`."""
    return f"{row.dtype}[{','.join(map(str, row.shape or ()))}]"


def render(summary: ModelSummary, *, title: str = "Model summary", arrays: bool = False) -> Group:
    """A rich table of `summary`'s layers (or of every array: `arrays`) and its totals lines.

    Cells fold a long name onto more lines rather than cut it, and number columns never shrink:
    no number is ever shown cut."""
    table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    number = {"justify": "right", "no_wrap": True}
    if arrays:
        # the count is the type's shape: not a column of its own (the layer rows have counts)
        table.add_column("Array", overflow="fold")
        table.add_column("Kind", overflow="fold")
        table.add_column("Type", overflow="fold")
        table.add_column("Size", **number)
        if summary.sharded:
            table.add_column("Split", overflow="fold")
            table.add_column("Per device", **number)
        for row in summary.rows:
            cells = ["/".join(filter(None, (row.module, row.name))), row.collection, _typed_shape(row),
                     _bytes(row.nbytes)]
            if summary.sharded:  # "-": every device holds all of it
                cells += [row.sharding if row.sharding not in (None, "replicated") else "-",
                          _bytes(row.device_bytes)]
            table.add_row(*cells)
    else:
        table.add_column("", **number)
        table.add_column("Name", overflow="fold")
        table.add_column("Params", **number)
        if summary.frozen_count:
            table.add_column("Frozen", **number)
        table.add_column("Other state", **number)
        table.add_column("Size", **number)
        if summary.sharded:
            table.add_column("Per device", **number)
        for i, layer in enumerate(summary.layers):
            frozen = [_human(layer.frozen) if layer.frozen else "-"] if summary.frozen_count else []
            cells = [str(i), layer.name, _human(layer.params), *frozen,
                     _human(layer.other) if layer.other else "-", _bytes(layer.nbytes)]
            if summary.sharded:
                cells.append(_bytes(layer.device_bytes))
            table.add_row(*cells)
    return Group(table, *(Text(line) for line in totals(summary)))


class RichModelSummary(Callback):
    """Prints a table of the model's layers when `fit` starts (on by default: `enable_model_summary`).

    One row per layer, as Lightning's `ModelSummary`: its name (module path), parameter count,
    other state (BatchNorm statistics, NNX rng counters) and bytes, then the totals; on a mesh of
    several devices also the bytes one device holds. `arrays=True` lists every array instead:
    its path, kind (`params`, `batch_stats`, ...), type (`float32[3,3,32]`), bytes and, on a
    mesh, its partition spec (`-`: replicated) and the bytes one device holds. Fits 80 columns.

    Args:
        max_depth: the depth of the module path a row sums (Lightning's: 1 the top-level
            layers, -1 every module whole, 0 the totals only).
        arrays: one row per array instead of per layer.
        file: where to print (default stdout).
        console_kwargs: more arguments for the `rich.console.Console` it prints with, e.g.
            `{"width": 120}` or `{"record": True}` (read back with `summary.console.export_text()`).

    Example:
        >>> import fitjax as fj
        >>> trainer = fj.Trainer(callbacks=[fj.RichModelSummary(max_depth=1)])
    """

    def __init__(self, max_depth: int = 1, *, arrays: bool = False, file: TextIO | None = None,
                 console_kwargs: dict[str, Any] | None = None):
        if not isinstance(max_depth, int) or isinstance(max_depth, bool) or max_depth < -1:
            raise ValueError(f"RichModelSummary(max_depth=...) must be an int >= -1 (Lightning's: 1 the "
                             f"top-level layers, -1 every module, 0 totals only), got {max_depth!r}")
        if not isinstance(arrays, bool):
            raise ValueError(f"RichModelSummary(arrays=...) must be True or False, got {arrays!r}")
        self.max_depth, self.arrays = max_depth, arrays
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
        self.summary = summarize(state.params, state.model_state, max_depth=self.max_depth or 1,
                                 model=model, order=module.variable_order,
                                 trains=module.trainable_mask(state.params), opt_state=state.opt_state)
        self.console = Console(**{"file": self._file or sys.stdout, **self._console_kwargs})
        title = f"{type(module).__name__} summary"
        if self.max_depth == 0 and not self.arrays:  # Lightning's max_depth=0: the totals only
            self.console.print("\n".join([title, *totals(self.summary)]), highlight=False, markup=False)
            return
        self.console.print(render(self.summary, title=title, arrays=self.arrays), highlight=False)
