"""Several processes (hosts) through `jax.distributed`: start once, agree on stops, gather rows.

JAX's multi-controller runtime is the engine: every process runs the same script, owns its local
devices, and the jitted step spans all of them. fitjax only starts the runtime, makes the
processes take the same Python-side decisions (a process that leaves the loop alone would leave
the others waiting in a collective forever) and brings sharded outputs back to every host.
"""

from __future__ import annotations

import errno
import socket
from typing import Any, Sequence

import jax
import numpy as np
from jax.experimental import multihost_utils

from fitjax._typing import PyTree
from fitjax.plugins import environments
from fitjax.plugins.environments import ClusterEnvironment, LightningEnvironment

__all__ = ["agree", "gather_rows", "initialize_distributed"]


def initialize_distributed(num_nodes: int | None = None, *, devices: Any = "auto", plugins: Any = None,
                           coordinator_address: str | None = None,
                           process_id: int | None = None) -> ClusterEnvironment:
    """Starts `jax.distributed` once, from the cluster environment, before anything touches a device.

    The environment is `plugins`' `ClusterEnvironment` or the detected one
    (`fj.plugins.environments.detect`: SLURM, torchrun, Kubeflow, MPI, SkyPilot, Cloud TPU, else
    `fitjax launch`'s variables). When it describes several processes, its world size, rank,
    coordinator, local devices and timeouts are what `jax.distributed.initialize` gets (JAX's own
    detection is off: one source of truth). `num_nodes` (machines) and an int `devices` (devices
    per machine) take Lightning's meanings and are checked against it; None takes its numbers.
    `coordinator_address` and `process_id` override the environment's. A no-op when started.

    Returns:
        The environment (what the banner names).

    Example:
        >>> import fitjax as fj
        >>> fj.strategies.initialize_distributed(num_nodes=1)  # one process: nothing to start
        LightningEnvironment(world_size=1, global_rank=0, local_rank=0, node_rank=0)
    """
    if num_nodes is not None and (isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 1):
        raise ValueError(f"Trainer(num_nodes=...) must be a positive int (machines) or None (the environment's "
                         f"count), got {num_nodes!r}")
    environment = environments.from_plugins(plugins)
    started = jax.distributed.is_initialized()
    if isinstance(environment, LightningEnvironment) and environment.world_size() == 1:
        if started:  # started by hand: JAX's numbers are the facts
            environment.set_world_size(jax.process_count())
            environment.set_global_rank(jax.process_index())
        elif num_nodes is not None and num_nodes > 1:  # no count in the environment: one process per machine
            environment.set_world_size(num_nodes * environment.local_world_size())
    environment.validate_settings(devices, num_nodes)
    world = environment.world_size()
    if not started and world > 1:
        coordinator = coordinator_address or environment.coordinator_address()
        if coordinator is None:
            raise ValueError(
                f"{type(environment).__name__} describes {world} processes but no coordinator "
                f"({environment.describe_variables()}): set JAX_COORDINATOR_ADDRESS=host:port, or "
                "MASTER_ADDR and MASTER_PORT, for every process (process 0's host)."
            )
        rank = environment.global_rank() if process_id is None else process_id
        if rank == 0:
            _check_coordinator_port(coordinator, environment)
        try:
            jax.distributed.initialize(
                coordinator, num_processes=world,
                process_id=rank,
                local_device_ids=environment.local_device_ids(), cluster_detection_method="deactivate",
                **environment.timeouts)
        except RuntimeError as exc:
            if "before" in str(exc):
                raise RuntimeError(
                    f"{type(environment).__name__} describes {world} processes, so jax.distributed must start "
                    "before anything uses a JAX device, but this process already has. Build the Trainer "
                    "first, or call `fj.strategies.initialize_distributed()` at the top of the script."
                ) from exc
            raise
    if jax.distributed.is_initialized() and jax.process_count() != world:
        raise ValueError(
            f"{type(environment).__name__} describes {world} processes ({environment.describe_variables()}) "
            f"but jax.distributed runs {jax.process_count()}; start it once, from the same launcher."
        )
    _check_devices(devices, environment)
    return environment


def _check_coordinator_port(coordinator: str, environment: ClusterEnvironment) -> None:
    """Process 0 starts JAX's coordinator service on the port of `coordinator` ("host:port"),
    listening on every address of its machine. Where that port is taken JAX's runtime does not
    raise: it logs "Failed to add port to server" and the process dies of a segmentation fault.
    Checked here first, to say which port and how to choose another (a port taken between this
    check and JAX's start still fails JAX's way)."""
    port = coordinator.rpartition(":")[2]
    if not port.isdigit():
        return  # JAX's own error names a malformed address
    for family, anywhere in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            probe = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue  # no IPv6 on this machine: the IPv4 probe decides
        with probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC's server binds
            try:
                probe.bind((anywhere, int(port)))
            except OSError as exc:
                if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                    raise RuntimeError(
                        f"jax.distributed's coordinator cannot listen on port {port} of this machine (process "
                        f"0 starts it, at {coordinator!r}): {exc.strerror}. {type(environment).__name__} took the "
                        f"address from {environment.describe_variables()}; choose a free port for every process "
                        "(MASTER_PORT, or JAX_COORDINATOR_ADDRESS=host:port).") from exc
                continue  # this family cannot bind here (no such address): the other one decides
            return


def _check_devices(devices: Any, environment: ClusterEnvironment) -> None:
    """With several processes an int `devices` counts one machine's devices (Lightning's meaning)."""
    if jax.process_count() == 1 or isinstance(devices, bool) or not isinstance(devices, int) or devices == -1:
        return
    local, per_machine = jax.local_device_count(), environment.local_world_size()
    if devices != local * per_machine:
        raise ValueError(
            f"Trainer(devices={devices}) but each machine of this run has {local * per_machine} devices: "
            f"{per_machine} process{'es' if per_machine != 1 else ''} of {local} device{'s' if local != 1 else ''} "
            f"({type(environment).__name__}: {environment.describe_variables()}). With several processes, "
            f"devices counts one machine's devices, as in Lightning, and all of them train: pass "
            f"devices={local * per_machine} or 'auto'."
        )


def agree(flag: bool) -> bool:
    """True on every process when `flag` is True on any: one small collective across processes.

    Call it only where every process calls it (the same step, the same place in the loop).
    """
    if jax.process_count() == 1:
        return bool(flag)
    flags = multihost_utils.process_allgather(np.asarray(flag, np.int32))  # sync point, all hosts
    return bool(np.any(flags))


def broadcast_str(text: str) -> str:
    """Process 0's `text` on every process (one collective; free with one process).

    For host-side facts that must agree, like the checkpoint folder a logger's version decides.
    """
    if jax.process_count() == 1:
        return text
    data = np.frombuffer(text.encode(), np.uint8)
    size = int(multihost_utils.broadcast_one_to_all(np.int32(len(data))))
    padded = np.zeros(size, np.uint8)
    padded[: min(size, len(data))] = data[:size]
    return bytes(np.asarray(multihost_utils.broadcast_one_to_all(padded))).decode()


def gather_rows(outputs: Sequence[PyTree], sizes: Sequence[int]) -> list[Any]:
    """Host (numpy) copies of per-batch outputs with padding rows removed, on every process.

    Each output's leading dimension is a global batch made of `process_count` equal local
    slices, this process's holding `sizes[i]` real rows; the others' counts are gathered too,
    so every process returns every example once, in input order.
    """
    if jax.process_count() == 1:
        host = jax.device_get(list(outputs))  # sync point: one transfer for all batches
        return [jax.tree.map(lambda x, n=n: np.asarray(x)[:n], out) for out, n in zip(host, sizes)]
    counts = multihost_utils.process_allgather(np.asarray(sizes, np.int64))  # [processes, batches]
    host = multihost_utils.process_allgather(list(outputs), tiled=True)  # sync point: whole arrays, each host
    processes = jax.process_count()

    def trim(x: np.ndarray, i: int) -> np.ndarray:
        x = np.asarray(x)
        blocks = x.reshape(processes, x.shape[0] // processes, *x.shape[1:])
        return np.concatenate([blocks[p, : counts[p, i]] for p in range(processes)])

    return [jax.tree.map(lambda x, i=i: trim(x, i), out) for i, out in enumerate(host)]
