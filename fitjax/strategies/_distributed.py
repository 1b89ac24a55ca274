"""Several processes (hosts) through `jax.distributed`: start once, agree on stops, gather rows.

JAX's multi-controller runtime is the engine: every process runs the same script, owns its local
devices, and the jitted step spans all of them. fitjax only starts the runtime, makes the
processes take the same Python-side decisions (a process that leaves the loop alone would leave
the others waiting in a collective forever) and brings sharded outputs back to every host.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import jax
import numpy as np
from jax.experimental import multihost_utils

from fitjax._typing import PyTree

__all__ = ["agree", "gather_rows", "initialize_distributed"]

# Launch environments that mean "this is one of several processes" (JAX reads the SLURM and
# Open MPI ones itself when `jax.distributed.initialize()` gets no arguments).
_WORLD_SIZE_VARS = ("JAX_NUM_PROCESSES", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "WORLD_SIZE")
_PROCESS_ID_VARS = ("JAX_PROCESS_ID", "NODE_RANK", "RANK")


def _env_int(names: Sequence[str]) -> int | None:
    for name in names:
        value = os.environ.get(name)
        if value:
            try:
                return int(value)
            except ValueError:
                raise ValueError(f"the environment variable {name}={value!r} must be an int") from None
    return None


def _coordinator_from_env() -> str | None:
    if os.environ.get("JAX_COORDINATOR_ADDRESS"):
        return os.environ["JAX_COORDINATOR_ADDRESS"]
    if os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"):  # torchrun / Lightning
        return f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    return None


def initialize_distributed(num_nodes: int | None = None, *, coordinator_address: str | None = None,
                           process_id: int | None = None) -> None:
    """Starts `jax.distributed` once, before anything touches a device; a no-op when started.

    `num_nodes=None` starts it only when the environment describes several processes
    (`JAX_NUM_PROCESSES`, SLURM, Open MPI, `WORLD_SIZE`); `num_nodes=1` never starts it. The
    coordinator comes from the argument, `JAX_COORDINATOR_ADDRESS` or `MASTER_ADDR:MASTER_PORT`,
    the process id from the argument, `JAX_PROCESS_ID`, `NODE_RANK` or `RANK`; what is still
    missing JAX detects itself (SLURM, Open MPI, Kubernetes, Cloud TPU).

    Example:
        >>> import fitjax as fj
        >>> fj.strategies.initialize_distributed(num_nodes=1)  # one process: nothing to start
    """
    if num_nodes is not None and (isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 1):
        raise ValueError(f"Trainer(num_nodes=...) must be a positive int or None (from the environment), got {num_nodes!r}")
    if jax.distributed.is_initialized():
        _check_count(num_nodes)
        return
    if num_nodes is None:
        num_nodes = _env_int(_WORLD_SIZE_VARS)
    if num_nodes is None or num_nodes == 1:
        return
    coordinator_address = coordinator_address or _coordinator_from_env()
    process_id = _env_int(_PROCESS_ID_VARS) if process_id is None else process_id
    try:
        jax.distributed.initialize(coordinator_address, num_processes=num_nodes, process_id=process_id)
    except RuntimeError as exc:
        if "before" in str(exc):
            raise RuntimeError(
                f"Trainer(num_nodes={num_nodes}) must start jax.distributed before anything uses a "
                "JAX device, but this process already has. Build the Trainer first, or call "
                "`fj.strategies.initialize_distributed(num_nodes)` at the top of the script."
            ) from exc
        raise
    _check_count(num_nodes)


def _check_count(num_nodes: int | None) -> None:
    if num_nodes is not None and jax.process_count() != num_nodes:
        raise ValueError(
            f"Trainer(num_nodes={num_nodes}) but jax.distributed runs {jax.process_count()} processes; "
            "launch one process per node, or pass the count the launcher started."
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
