"""`FSDP`: parameters, optimizer state and model state sharded over an `fsdp` mesh axis.

Each device keeps `1/fsdp` of every large array; XLA all-gathers a parameter where the step uses
it and reduce-scatters its gradient, so memory for the state shrinks with the device count while
the numbers stay those of one device with the same global batch. A `data` axis on top gives a
hybrid mesh: `data` replicas of a model sharded `fsdp` ways. A `tensor` axis (Megatron-style tensor
parallelism) splits the dimensions whose logical names the rules map to it, such as attention heads
and the MLP's hidden units; the batch is not split over it, so its devices share each batch.
"""

from __future__ import annotations

import copy
import functools
from typing import Any, Callable, Mapping, Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from fitjax._typing import PyTree
from fitjax.strategies import _rules
from fitjax.strategies._base import Strategy

__all__ = ["FSDP", "with_model_rules"]


def _check_axis(name: str, value: Any) -> int | None:
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value > 0):
        return value
    raise ValueError(f"FSDP({name}=...) must be a positive int or None (chosen from the devices), got {value!r}")


class FSDP(Strategy):
    """Fully sharded data parallelism on a `("data", "fsdp", "tensor")` mesh.

    The batch is split over `data` and `fsdp`; `tensor` (1 unless asked for) splits the array
    dimensions that `rules` map to it, and its devices see the same rows of each batch.

    Args:
        data: replicas of the sharded model (the outer mesh axis); None: the devices left over
            by `fsdp`, or 1.
        fsdp: devices each array is sharded over; None: all devices left over by `data` and
            `tensor`.
        tensor: devices the dimensions mapped to the `tensor` axis are split over (attention
            heads, the MLP's hidden units: Megatron-style tensor parallelism); it must divide
            the device count. Only annotated parameters use it: map their logical names to
            "tensor" in `rules`.
        min_size_to_shard: arrays with fewer elements stay replicated (their all-gather costs
            more than the memory saved); scalars and vectors always do.
        rules: logical axis names of Flax annotations (`nn.with_logical_partitioning`) -> a mesh
            axis, a tuple of them, or None (replicate). Mesh axis names ("data", "fsdp",
            "tensor") can be used in annotations directly. A module that declares its model's
            rules (`LitModule.logical_axis_rules`: every `fitjax.models.CausalLMModule`) has them
            used for the names these rules do not map (`with_model_rules`), so `FSDP(tensor=2)`
            splits its heads with no rules given.

    Annotated parameters (`nn.with_partitioning`, `nn.with_logical_partitioning`, NNX
    `sharding` metadata) follow their annotation, as do the optimizer-state arrays mirroring
    them; every other array follows the rule: its largest dimension divisible by `fsdp`.

    With `rules`, the step is traced under them and the mesh (flax's `nn.logical_axis_rules`
    and `jax.sharding.use_abstract_mesh`), so a Linen model can place its activations with
    `nn.with_logical_constraint(x, ("batch", None, "heads", None))`: map `"batch"` to
    `("data", "fsdp")` in the rules. Without rules (and under "dp" or "single") such
    constraints do nothing. XLA otherwise picks activation layouts from the parameters alone,
    and for a transformer under fsdp × tensor it gathers whole batches instead of weights.

    Initialisation is sharded: a Linen model's variables are created by one jitted init whose
    outputs carry these shardings, so the whole state never exists on one device. An NNX model
    built eagerly already holds its arrays where it was built; they are copied into the sharded
    layout once (build it under `nnx.use_eager_sharding(False)` for annotations to need no mesh,
    or inside `jax.set_mesh(...)` to create it sharded).

    Example:
        >>> import fitjax as fj
        >>> trainer = fj.Trainer(strategy="fsdp")                    # all devices on `fsdp`
        >>> hybrid = fj.strategies.FSDP(data=2, fsdp=4)               # 2 replicas × 4 shards
        >>> named = fj.strategies.FSDP(rules={"embed": "fsdp", "mlp": None})
        >>> megatron = fj.strategies.FSDP(tensor=2, rules={"embed": "fsdp", "heads": "tensor",
        ...                                                "mlp": "tensor", "batch": ("data", "fsdp")})
    """

    data_axes = ("data", "fsdp")

    def __init__(self, data: int | None = None, fsdp: int | None = None, *, tensor: int = 1,
                 min_size_to_shard: int = 2**14, rules: Mapping[str, Any] | None = None):
        super().__init__()
        self.data = _check_axis("data", data)
        self.fsdp = _check_axis("fsdp", fsdp)
        if isinstance(tensor, bool) or not isinstance(tensor, int) or tensor < 1:
            raise ValueError(f"FSDP(tensor=...) must be a positive int (devices per tensor group), got {tensor!r}")
        self.tensor = tensor
        if isinstance(min_size_to_shard, bool) or not isinstance(min_size_to_shard, int) or min_size_to_shard < 0:
            raise ValueError(
                f"FSDP(min_size_to_shard=...) must be a non-negative int (elements), got {min_size_to_shard!r}"
            )
        self.min_size_to_shard = min_size_to_shard
        if rules is not None and not isinstance(rules, Mapping):
            raise TypeError(
                f"FSDP(rules=...) maps logical axis names to mesh axes, e.g. {{'embed': 'fsdp'}}; got {rules!r}"
            )
        # lists (from YAML or JSON) are tuples of mesh axes, as a PartitionSpec entry wants them
        self.rules = {name: tuple(axes) if isinstance(axes, list) else axes for name, axes in (rules or {}).items()}

    def with_model_rules(self, rules: Mapping[str, Any] | None) -> "FSDP":
        """This strategy (its mesh too) with a model's own `rules` for the logical names its
        `rules` leave out (the user's win); itself when `rules` is empty. A new value: the
        strategy the user made is not changed."""
        if not rules:
            return self
        merged = copy.copy(self)
        merged.rules = {**{name: tuple(axes) if isinstance(axes, list) else axes for name, axes in rules.items()},
                        **self.rules}
        return merged

    def _build_mesh(self, devices: Sequence[jax.Device]) -> Mesh:
        n, tensor = len(devices), self.tensor
        if n % tensor:
            raise ValueError(
                f"FSDP(tensor={tensor}) does not divide the {n} selected devices; use a divisor of "
                f"{n} or select a multiple of {tensor} devices with Trainer(devices=...)."
            )
        rest = n // tensor  # devices per tensor position: data × fsdp
        data, fsdp = self.data, self.fsdp
        if data is None and fsdp is None:
            data, fsdp = 1, rest
        elif data is None or fsdp is None:
            given, name = (data, "data") if fsdp is None else (fsdp, "fsdp")
            if rest % given:
                left = f"the {n} devices" if tensor == 1 else f"the {rest} devices left by tensor={tensor}"
                raise ValueError(
                    f"FSDP({name}={given}) does not divide {left}; use a divisor of {rest} "
                    f"or select {given * max(1, rest // given) * tensor} devices with Trainer(devices=...)."
                )
            data, fsdp = (given, rest // given) if name == "data" else (rest // given, given)
        if data * fsdp * tensor != n:
            sizes, names = f"data={data}, fsdp={fsdp}", "data × fsdp"
            if tensor != 1:
                sizes, names = f"{sizes}, tensor={tensor}", f"{names} × tensor"
            need = data * fsdp * tensor
            raise ValueError(
                f"FSDP({sizes}) needs {names} = {need} devices, but {n} are selected. Choose sizes "
                f"whose product is {n}, leave data or fsdp None, or select {need} devices with "
                f"Trainer(devices={need})."
            )
        # tensor innermost: its groups are neighbouring devices (the same host, the fastest links)
        return Mesh(np.asarray(devices).reshape(data, fsdp, tensor), ("data", "fsdp", "tensor"))

    def jit(self, fn: Callable, **kwargs: Any) -> Callable:
        """`Strategy.jit`, with `fn` traced under the logical axis rules and the mesh (when rules
        are given): `nn.with_logical_constraint` in the model then resolves through them."""
        if not self.rules:
            return super().jit(fn, **kwargs)
        rules, mesh = tuple(self.rules.items()), self.mesh.abstract_mesh

        @functools.wraps(fn)
        def under_rules(*args):
            with jax.sharding.use_abstract_mesh(mesh), nn.logical_axis_rules(rules):
                return fn(*args)

        return super().jit(under_rules, **kwargs)

    def state_shardings(self, abstract_state: PyTree, annotations: _rules.Annotations | None = None
                        ) -> PyTree:
        specs = _rules.fsdp_specs(
            abstract_state, self.mesh, axis="fsdp", min_size=self.min_size_to_shard,
            rules=self.rules, annotations=annotations or {},
        )
        return jax.tree.map(lambda spec: NamedSharding(self.mesh, spec), specs,
                            is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))


def with_model_rules(strategy: Strategy, rules: Mapping[str, Any] | None) -> Strategy:
    """`strategy` with a module's declared logical axis rules (`LitModule.logical_axis_rules`)
    for what it does not map itself: an `FSDP` gains them (`FSDP.with_model_rules`); the other
    strategies lay out no logical names and are returned as they are."""
    return strategy.with_model_rules(rules) if isinstance(strategy, FSDP) else strategy
