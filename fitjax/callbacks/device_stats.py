"""`DeviceStatsMonitor`: the accelerator's memory (and the host's) logged at log steps, as Lightning's.

The numbers come from `jax.Device.memory_stats()`, a query of the runtime's allocator: no device
array is read, so logging them adds no host sync to the step loop. Backends without allocator
stats (the CPU backend returns None) get the host's instead: the process's resident memory and,
where psutil is installed, Lightning's CPU stats (`cpu_percent`, `cpu_vm_percent`,
`cpu_swap_percent`).
"""

from __future__ import annotations

from typing import Any

import jax

from fitjax.callbacks._base import Callback, ignores_batch, ignores_outputs

__all__ = ["DeviceStatsMonitor"]


def device_stats(device: jax.Device) -> dict[str, float]:
    """The numeric fields of `device.memory_stats()` (`bytes_in_use`, `peak_bytes_in_use`,
    `bytes_limit`, ... as the backend names them), or `{}` where the backend keeps none."""
    stats = device.memory_stats() or {}
    return {k: float(v) for k, v in sorted(stats.items()) if isinstance(v, (int, float)) and not isinstance(v, bool)}


def host_stats() -> dict[str, float]:
    """This process's resident and peak resident bytes, and psutil's CPU use (Lightning's keys)
    where psutil is installed (fitjax does not require it; Lightning does for CPU stats)."""
    # VmRSS and VmHWM (its high-water mark) in one read, so the peak is never below the current
    # value (getrusage's maxrss is updated lazily and can be). Linux only, as the rest of fitjax.
    with open("/proc/self/status") as f:
        kib = {k: int(v.split()[0]) for k, _, v in (line.partition(":") for line in f) if k in ("VmRSS", "VmHWM")}
    values = {"cpu_peak_rss_bytes": float(kib["VmHWM"] * 1024), "cpu_rss_bytes": float(kib["VmRSS"] * 1024)}
    try:
        import psutil
    except ImportError:
        return values
    values.update(cpu_percent=float(psutil.cpu_percent()), cpu_swap_percent=float(psutil.swap_memory().percent),
                  cpu_vm_percent=float(psutil.virtual_memory().percent))
    return dict(sorted(values.items()))


def _next_is_multiple(count: int, every: int | None) -> bool:
    # Whether `count + 1` is a multiple of `every`; the loop's `progress.crossed` answers it for
    # the last call only, and importing the loop here would be circular.
    return bool(every) and (count + 1) % every == 0


class DeviceStatsMonitor(Callback):
    """Logs device memory in use, its peak and its limit at each log step of training and evaluation.

    Keys have Lightning's shape, `DeviceStatsMonitor.<hook>/<stat>`: for example
    `DeviceStatsMonitor.on_train_batch_end/bytes_in_use`, `.../peak_bytes_in_use`,
    `.../bytes_limit` on a GPU or TPU (JAX's names for them), and `.../cpu_rss_bytes`,
    `.../cpu_percent`, ... for the host. Stats are those of the first device this process trains on.
    Train hooks (batch start and end) log on the steps `log_every_n_steps` selects (at the logger's step of that train
    row); validation and test batch starts and ends every `log_every_n_steps` batches.

    Args:
        cpu_stats: None (default) logs host stats only where the device keeps no allocator stats
            (the CPU backend); True logs them besides the device's; False never (and on the CPU
            backend then logs nothing, as Lightning).

    Raises:
        ValueError: at `fit` when the trainer has no logger (`logger=False`).

    Example:
        >>> import fitjax as fj
        >>> trainer = fj.Trainer(callbacks=[fj.DeviceStatsMonitor()], log_every_n_steps=50)
    """

    def __init__(self, cpu_stats: bool | None = None):
        if cpu_stats not in (None, True, False):
            raise ValueError(f"DeviceStatsMonitor(cpu_stats=...) must be None, True or False, got {cpu_stats!r}")
        self._cpu_stats = cpu_stats
        self._device: jax.Device | None = None

    def setup(self, trainer, module, stage: str) -> None:
        if stage == "fit" and not trainer.loggers:
            raise ValueError(
                "DeviceStatsMonitor logs to the trainer's loggers, and this Trainer has none "
                f"(loggers={trainer.loggers!r}); pass a logger, e.g. `logger=fj.CSVLogger('logs')`, "
                "or leave `logger` at its default."
            )
        own = [d for d in trainer.strategy.mesh.devices.flat if d.process_index == jax.process_index()]
        self._device = own[0]

    def stats(self) -> dict[str, float]:
        """The stats one log step writes, without the key prefix (`{}` before `setup`)."""
        if self._device is None:
            return {}
        values = device_stats(self._device)
        if self._cpu_stats or (self._cpu_stats is None and not values):
            values.update(host_stats())
        return values

    def _log(self, module, hook: str) -> None:
        values = self.stats()
        if values:  # at the row of the batch's train values (the metric log's rule)
            module.log_dict({f"{type(self).__qualname__}.{hook}/{k}": v for k, v in values.items()})

    @ignores_batch
    def on_train_batch_start(self, trainer, module, batch: Any, batch_idx: int) -> None:
        if _next_is_multiple(trainer.global_step, trainer.log_every_n_steps):  # the coming step
            self._log(module, "on_train_batch_start")

    @ignores_outputs
    @ignores_batch
    def on_train_batch_end(self, trainer, module, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.progress.crossed(trainer.log_every_n_steps):
            self._log(module, "on_train_batch_end")

    @ignores_batch
    def on_validation_batch_start(self, trainer, module, batch: Any, batch_idx: int,
                                  dataloader_idx: int = 0) -> None:
        if _next_is_multiple(batch_idx, trainer.log_every_n_steps):
            self._log(module, "on_validation_batch_start")

    @ignores_outputs
    @ignores_batch
    def on_validation_batch_end(self, trainer, module, outputs: Any, batch: Any, batch_idx: int,
                                dataloader_idx: int = 0) -> None:
        if _next_is_multiple(batch_idx, trainer.log_every_n_steps):
            self._log(module, "on_validation_batch_end")

    @ignores_batch
    def on_test_batch_start(self, trainer, module, batch: Any, batch_idx: int,
                            dataloader_idx: int = 0) -> None:
        if _next_is_multiple(batch_idx, trainer.log_every_n_steps):
            self._log(module, "on_test_batch_start")

    @ignores_outputs
    @ignores_batch
    def on_test_batch_end(self, trainer, module, outputs: Any, batch: Any, batch_idx: int,
                          dataloader_idx: int = 0) -> None:
        if _next_is_multiple(batch_idx, trainer.log_every_n_steps):
            self._log(module, "on_test_batch_end")
