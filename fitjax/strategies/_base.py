"""`Strategy`: how arrays are laid out over devices. It supplies shardings; the step is shared.

A strategy owns a `jax.sharding.Mesh`. The batch is split over `data_axes`; the train state is
laid out by `state_shardings` (replicated here; FSDP overrides it to shard parameters). The same
jitted step serves every strategy: only its `in_shardings`/`out_shardings` differ.
"""

from __future__ import annotations

import abc
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from fitjax._platform import traced_for
from fitjax._typing import Batch, PyTree
from fitjax.strategies._memory import device_inputs

__all__ = ["Strategy"]


class Strategy(abc.ABC):
    """Base class: build a mesh in `setup`, then say how the state and batches are sharded.

    Subclasses implement `_build_mesh` and may override `state_shardings`.
    """

    #: mesh axes the batch's leading dimension is split over
    data_axes: tuple[str, ...] = ("data",)

    def __init__(self) -> None:
        self._mesh: Mesh | None = None

    # ------------------------------------------------------------------------ what subclasses say

    @abc.abstractmethod
    def _build_mesh(self, devices: Sequence[jax.Device]) -> Mesh:
        """A mesh over `devices` whose axes include `data_axes`."""

    def state_shardings(self, abstract_state: PyTree, annotations: Mapping | None = None) -> PyTree:
        """Shardings for every leaf of the train state (default: replicated on the mesh).

        `annotations` are the model's Flax sharding annotations, `{("params", ...path): names}`;
        strategies that shard parameters honour them, the replicated ones ignore them.
        """
        replicated = self.replicated
        return jax.tree.map(lambda _: replicated, abstract_state)

    # ----------------------------------------------------------------------------- shared parts

    def setup(self, devices: Sequence[jax.Device]) -> None:
        """Builds the mesh over `devices` (called by the trainer once, before the first step)."""
        self._mesh = self._build_mesh(list(devices))

    @property
    def mesh(self) -> Mesh:
        if self._mesh is None:
            raise RuntimeError(f"{type(self).__name__}.setup(devices) must run before the mesh is used")
        return self._mesh

    @property
    def platform(self) -> str:
        """The mesh's device platform: "cpu", "gpu" or "tpu"."""
        return self.mesh.devices.flat[0].platform

    @property
    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, P())

    @property
    def batch_sharding(self) -> NamedSharding:
        return NamedSharding(self.mesh, P(self.data_axes))

    @property
    def num_batch_shards(self) -> int:
        """How many pieces each global batch is split into."""
        return int(np.prod([self.mesh.shape[a] for a in self.data_axes]))

    def check_batch_size(self, size: int, *, what: str = "the global batch size") -> None:
        shards = self.num_batch_shards
        if size % shards:
            raise ValueError(
                f"{what} is {size}, which does not divide over the {shards} devices of the "
                f"{type(self).__name__} strategy's {'×'.join(self.data_axes)} mesh axis. Use a batch "
                f"size that is a multiple of {shards} (e.g. {max(shards, size - size % shards)}), or "
                "fewer devices (`Trainer(devices=...)`)."
            )

    def shard_batch(self, batch: Batch) -> Batch:
        """Host batch -> what the jitted step takes for its batch argument.

        With one process the host (numpy) batch is returned as is: the jitted step's
        `in_shardings` place it, and jit's C++ dispatch does that far faster than a Python
        `jax.device_put` per step (~0.5 ms each). With several processes each process holds only
        its rows, so they are assembled into global arrays here.
        """
        if jax.process_count() == 1:
            return batch
        sharding = self.batch_sharding
        return jax.tree.map(lambda x: jax.make_array_from_process_local_data(sharding, x), batch)

    def put(self, tree: Any, shardings: Any) -> Any:
        """Host (numpy) values that every process holds whole -> global arrays laid out as
        `shardings` (one sharding, or a tree of them), each device given its part. Unlike
        `jax.device_put`, no program and no exchange between processes."""
        if isinstance(shardings, jax.sharding.Sharding):
            shardings = jax.tree.map(lambda _, one=shardings: one, tree)
        return jax.tree.map(lambda x, s: jax.make_array_from_callback(x.shape, s, x.__getitem__), tree, shardings)

    def jit(self, fn: Callable, *, in_shardings: Any = None, out_shardings: Any = None,
            donate_argnums: tuple[int, ...] = (), compiler_options: dict[str, Any] | None = None,
            fetch_host: bool = True) -> Callable:
        """`jax.jit` under this mesh: the one place a strategy's layout reaches compilation (fitjax
        calls it through `fitjax.step.compiling.jit`, which adds the platform's compiler options).
        `fn` is traced for this mesh's platform (`fitjax._platform`), which is not the process's
        default one when the planner compiles for a TPU slice from a CPU machine, and with this
        mesh as `fitjax._platform.traced_mesh()`. A sharding left None is not given to `jax.jit`:
        the inputs' follow the arguments as placed, the outputs' are XLA's choice.

        An argument whose in_sharding keeps it in host memory (`fitjax.strategies._memory`) is
        copied to device memory at the start of `fn`, so `fn` computes on device arrays only;
        `fetch_host=False`: `fn` takes them where they are and copies what it reads itself."""
        if fetch_host and in_shardings is not None:
            fn = device_inputs(fn, in_shardings)
        shardings = {name: value for name, value in (("in_shardings", in_shardings), ("out_shardings", out_shardings))
                     if value is not None}
        return jax.jit(traced_for(fn, self.platform, self.mesh), donate_argnums=donate_argnums,
                       compiler_options=compiler_options, **shardings)

    def traced_on_mesh(self, fn: Callable) -> Callable:
        """`fn` traced with this mesh as `fitjax._platform.traced_mesh()` (its platform left as is):
        `fj.nn.attention` reads it to split a kernel XLA cannot partition (`shard_map`)."""
        return traced_for(fn, None, self.mesh)

    def __repr__(self) -> str:
        shape = dict(self._mesh.shape) if self._mesh is not None else "not set up"
        return f"{type(self).__name__}(mesh={shape})"
