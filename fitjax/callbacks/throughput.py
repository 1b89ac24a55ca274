"""`ThroughputMonitor`: batches, samples, items and FLOPs per second, and MFU, as Lightning logs them.

Lightning's keys (checked against a run of Lightning 2.6.6's `ThroughputMonitor`, see
tests/callbacks/test_throughput.py), at each log step of training (row `global_step - 1`):
`train/time`, `train/batches`, `train/samples` (and `train/lengths` with a `length_fn`), then,
once `window_size` batches have run, `train/device/batches_per_sec`,
`train/device/samples_per_sec` (`train/device/items_per_sec`), `train/device/flops_per_sec` and
`train/device/mfu` where the device's peak is known. With several devices also the whole run's
`train/batches_per_sec`, `train/samples_per_sec` (`train/items_per_sec`) and
`train/flops_per_sec`. As in Lightning the counts are one device's: every device takes part in
each batch, and sees `1 / devices` of its samples (Lightning's world size is fitjax's devices).

What differs, and why:
- MFU is from model FLOPs, the work the model needs (MaxText's and PaLM's definition): a
  module's `flops_per_batch` (Lightning's attribute: one batch on one device), else `6N +
  attention` for a module declaring `transformer_shape = fj.TransformerShape(...)`, else XLA's
  own count of the compiled train step without rematerialization (`trainer.train_step_flops(
  remat="none")`: nothing to write, and every piece of the step is in it). What the hardware
  does, rematerialized work included, is XLA's count of the step as it runs, logged apart as
  `train/device/hardware_flops_per_sec` (`train/hardware_flops_per_sec` with several devices)
  and `train/device/hfu` (hardware FLOPs utilization): with `Trainer(remat=...)` it is higher
  while the model FLOPs and the MFU stay what they were.
- Times are read when the device has finished the steps, without a host sync per step: the
  monitor waits for the step at the first batch and at each log step (once per
  `log_every_n_steps`), and the rates are over the span between such points that covers the
  last `window_size` batches (Lightning waits for the GPU after every batch).
"""

from __future__ import annotations

import collections
import re
import time
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from fitjax.callbacks._base import Callback, ignores_outputs
from fitjax.planner import model_flops

__all__ = ["PEAK_FLOPS", "ThroughputMonitor", "peak_flops"]

# Dense peak FLOP/s of one chip (no structured sparsity), from the vendors' datasheets.
# "fp32" on an NVIDIA GPU is the TF32 tensor-core rate when XLA may use it (its default for f32
# matmuls on Ampere and later), "fp32-highest" when `jax_default_matmul_precision` asks for full
# f32. TPUs run f32 matmuls as bf16 passes under XLA's default precision: one figure.
PEAK_FLOPS: dict[str, dict[str, float]] = {
    "h200": {"bf16": 989.4e12, "fp16": 989.4e12, "fp32": 494.7e12, "fp32-highest": 66.9e12},
    "h200 nvl": {"bf16": 835.5e12, "fp16": 835.5e12, "fp32": 417.5e12, "fp32-highest": 60e12},
    "h100 sxm": {"bf16": 989.4e12, "fp16": 989.4e12, "fp32": 494.7e12, "fp32-highest": 66.9e12},
    "h100 pcie": {"bf16": 756e12, "fp16": 756e12, "fp32": 378e12, "fp32-highest": 51.2e12},
    "h100 nvl": {"bf16": 835.5e12, "fp16": 835.5e12, "fp32": 417.5e12, "fp32-highest": 60e12},
    "a100": {"bf16": 312e12, "fp16": 312e12, "fp32": 156e12, "fp32-highest": 19.5e12},
    "l4": {"bf16": 121e12, "fp16": 121e12, "fp32": 60e12, "fp32-highest": 30.3e12},
    "tpu v4": {"bf16": 275e12, "fp32": 275e12},
    "tpu v5e": {"bf16": 197e12, "fp32": 197e12},
    "tpu v5p": {"bf16": 459e12, "fp32": 459e12},
    "tpu v6e": {"bf16": 918e12, "fp32": 918e12},
}

# `jax.Device.device_kind` -> a row of PEAK_FLOPS (first match wins)
_KINDS = (
    (re.compile(r"h200.*nvl"), "h200 nvl"), (re.compile(r"h200"), "h200"),
    (re.compile(r"h100.*(pcie|hbm2e)"), "h100 pcie"), (re.compile(r"h100.*nvl"), "h100 nvl"),
    (re.compile(r"h100"), "h100 sxm"), (re.compile(r"a100"), "a100"), (re.compile(r"\bl4\b"), "l4"),
    (re.compile(r"^tpu v4$"), "tpu v4"), (re.compile(r"^tpu v5 ?(lite|e|litepod)$"), "tpu v5e"),
    (re.compile(r"^tpu v5p?$"), "tpu v5p"), (re.compile(r"^tpu v6 ?(lite|e)$"), "tpu v6e"),
)


def peak_flops(device_kind: str, dtype: Any) -> float | None:
    """The dense peak FLOP/s of one `device_kind` chip (as `jax.Device.device_kind` names it, e.g.
    "NVIDIA H100 80GB HBM3", "TPU v5 lite") computing in `dtype` (bf16, fp16 or fp32), from
    `PEAK_FLOPS`; None for a chip or dtype not in it (a CPU has no standard peak)."""
    kind = device_kind.lower().strip()
    row = next((name for pattern, name in _KINDS if pattern.search(kind)), None)
    if row is None:
        return None
    name = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(jnp.dtype(dtype).name)
    if name == "fp32" and jax.config.jax_default_matmul_precision in ("highest", "float32"):
        name = "fp32-highest" if "fp32-highest" in PEAK_FLOPS[row] else name
    return PEAK_FLOPS[row].get(name)


class _Point(NamedTuple):
    time: float
    batches: int
    samples: float
    lengths: float


class ThroughputMonitor(Callback):
    """Logs training throughput and MFU with Lightning's keys (see the module docstring).

    The model FLOPs behind `flops_per_sec` and the MFU are, in this order: the module's
    `flops_per_batch` (Lightning's attribute: a count the user wrote wins, a declared shape
    included), `6N + attention` for a module declaring `transformer_shape`, else XLA's count of
    the step without rematerialization.

    Args:
        batch_size_fn: samples in a batch, `batch -> int` (called on one micro-batch of each
            call of the train step: the batch as the loader yields it).
        length_fn: items (tokens) in a batch, `batch -> int`; adds `train/lengths` and
            `.../items_per_sec`.
        window_size: the rates cover (at least) the last this many batches; they appear once
            that many batches have run. At least 2.
        separator: between the key's parts (Lightning's `Throughput(separator=...)`).
        peak_flops: one device's peak FLOP/s for `train/device/mfu` (and `.../hfu`); None
            looks the chip and the precision's compute dtype up in `PEAK_FLOPS` (no MFU where
            it is not there).

    Attributes:
        metrics: the values of the last log step (host floats; `{}` before the first).

    Example:
        >>> import fitjax as fj
        >>> monitor = fj.ThroughputMonitor(batch_size_fn=lambda batch: batch["tokens"].shape[0],
        ...                                length_fn=lambda batch: batch["tokens"].size)
        >>> trainer = fj.Trainer(max_steps=1000, log_every_n_steps=10, callbacks=[monitor])
    """

    def __init__(self, batch_size_fn: Callable[[Any], int], length_fn: Callable[[Any], int] | None = None,
                 window_size: int = 100, *, separator: str = "/", peak_flops: float | None = None):
        if not callable(batch_size_fn):
            raise TypeError(f"ThroughputMonitor(batch_size_fn=...) must be a function `batch -> int`, "
                            f"got {batch_size_fn!r}; e.g. `lambda batch: batch['x'].shape[0]`.")
        if length_fn is not None and not callable(length_fn):
            raise TypeError(f"ThroughputMonitor(length_fn=...) must be None or a function `batch -> int`, "
                            f"got {length_fn!r}.")
        if isinstance(window_size, bool) or not isinstance(window_size, int) or window_size < 2:
            raise ValueError(f"ThroughputMonitor(window_size=...) must be an int of at least 2 (a rate needs "
                             f"two points), got {window_size!r}.")
        if peak_flops is not None and (isinstance(peak_flops, bool) or not isinstance(peak_flops, (int, float))
                                       or not peak_flops > 0):
            raise ValueError(f"ThroughputMonitor(peak_flops=...) must be a positive number (one device's peak "
                             f"FLOP/s, e.g. 989e12 for an H100's bf16) or None, got {peak_flops!r}.")
        self.batch_size_fn, self.length_fn = batch_size_fn, length_fn
        self.window_size, self.separator = window_size, separator
        self.peak_flops = None if peak_flops is None else float(peak_flops)
        self.metrics: dict[str, float] = {}
        self._available: float | None = None
        self._world = 1
        self._per_device = 1.0  # this process's samples -> one device's
        self._reset()

    def _reset(self) -> None:
        self._t0: float | None = None
        self._batches, self._samples, self._lengths = 0, 0.0, 0.0
        self._points: collections.deque[_Point] = collections.deque()
        self._flops_per_batch: tuple[float | None, float | None] | None = None  # (model, hardware)
        self._rows = 0  # rows of one micro-batch, all processes'
        self._val_started: float | None = None

    # --------------------------------------------------------------------------- hooks

    def on_train_start(self, trainer, module) -> None:
        self._reset()
        devices = trainer.strategy.mesh.devices
        self._world = int(devices.size)
        self._per_device = jax.process_count() / self._world
        self._available = self.peak_flops
        if self._available is None:
            self._available = peak_flops(devices.flat[0].device_kind, trainer.step_options.precision.compute_dtype)
        self._t0 = time.perf_counter()

    @ignores_outputs
    def on_train_batch_end(self, trainer, module, outputs: Any, batch: Any, batch_idx: int) -> None:
        progress = trainer.progress
        batches = progress.total_batches - progress.total_before
        micro = self._micro_batch(trainer, batch)
        if not self._rows:
            self._rows = jax.tree.leaves(micro)[0].shape[0] * jax.process_count()
        self._batches += batches
        self._samples += batches * self.batch_size_fn(micro) * self._per_device
        if self.length_fn is not None:
            self._lengths += batches * self.length_fn(micro) * self._per_device
        log_step = progress.crossed(trainer.log_every_n_steps)
        if not log_step and self._points:
            return
        jax.block_until_ready(outputs)  # sync point: the first call and each log step, not every step
        self._points.append(_Point(time.perf_counter() - self._t0, self._batches, self._samples, self._lengths))
        if log_step:
            self._log(trainer, module)

    def on_validation_start(self, trainer, module) -> None:
        if trainer.stage.name == "fit" and not trainer.sanity_checking and self._t0 is not None:
            jax.block_until_ready(trainer.state.step)  # sync point: the train steps before it are done
            self._val_started = time.perf_counter()

    def on_validation_end(self, trainer, module) -> None:
        if self._val_started is not None:  # as Lightning: validation is not training time
            self._t0 += time.perf_counter() - self._val_started
            self._val_started = None

    # ------------------------------------------------------------------------ the values

    def _micro_batch(self, trainer, batch: Any) -> Any:
        """One batch as the loader yields it, out of the call's stacked ones."""
        options = trainer.step_options
        k, spe = options.accumulate_grad_batches, options.steps_per_execution
        progress = trainer.progress
        if k > 1:
            batch = batch[0]  # (micro-batches, mask)
        lead = (spe > 1 and progress.global_step - progress.step_before == spe) + (k > 1)
        return jax.tree.map(lambda x: x[(0,) * lead], batch) if lead else batch

    def compute(self, trainer) -> dict[str, float]:
        """The values of the current log step from the points recorded so far (host work only)."""
        sep, now = self.separator, self._points[-1]
        values: dict[str, float] = {"time": now.time, "batches": now.batches, "samples": _number(now.samples)}
        if self.length_fn is not None:
            values["lengths"] = _number(now.lengths)
        if now.batches >= self.window_size:
            start = self._window_start(now.batches)
            elapsed, batches = now.time - start.time, now.batches - start.batches
            if elapsed > 0 and batches > 0:
                rates = {"batches_per_sec": batches / elapsed,
                         "samples_per_sec": (now.samples - start.samples) / elapsed}
                if self.length_fn is not None:
                    rates["items_per_sec"] = (now.lengths - start.lengths) / elapsed
                model, hardware = self._flops(trainer)
                if model is not None:
                    rates["flops_per_sec"] = model * batches / elapsed
                if hardware is not None:
                    rates["hardware_flops_per_sec"] = hardware * batches / elapsed
                for key, rate in rates.items():
                    values[f"device{sep}{key}"] = rate
                    if self._world > 1:
                        values[key] = rate * self._world
                if self._available:
                    if model is not None:
                        values[f"device{sep}mfu"] = rates["flops_per_sec"] / self._available
                    if hardware is not None:
                        values[f"device{sep}hfu"] = rates["hardware_flops_per_sec"] / self._available
        return {f"train{sep}{key}": value for key, value in values.items()}

    def _window_start(self, batches: int) -> _Point:
        """The newest point at least `window_size - 1` batches back (else the first one), after
        dropping the points older than it."""
        target = batches - (self.window_size - 1)
        while len(self._points) > 1 and self._points[1].batches <= target:
            self._points.popleft()
        return self._points[0]

    def _flops(self, trainer) -> tuple[float | None, float | None]:
        """(model, hardware) FLOPs of one micro-batch on one device (see the module docstring);
        the XLA counts compile once per fit."""
        if self._flops_per_batch is None:
            k = trainer.step_options.accumulate_grad_batches
            per_step = trainer.train_step_flops()
            hardware = None if per_step is None else per_step / k
            declared = model_flops(trainer.lightning_module, trainer.state.params, rows_per_step=self._rows,
                                   batches_per_step=1, devices=self._world)
            if declared is not None:
                model = declared.per_step / self._world
            elif trainer.step_options.remat == "none":
                model = hardware
            else:
                unrematerialized = trainer.train_step_flops(remat="none")
                model = None if unrematerialized is None else unrematerialized / k
            self._flops_per_batch = (model, hardware)
        return self._flops_per_batch

    def _log(self, trainer, module) -> None:
        self.metrics = self.compute(trainer)
        module.log_dict(self.metrics)  # at the row of the step's train values (Lightning's)


def _number(value: float) -> float | int:
    return int(value) if float(value).is_integer() else value
