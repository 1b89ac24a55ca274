"""A plan's result: every candidate measured, the recommendation and its reason; as a table or JSON."""

from __future__ import annotations

import dataclasses
import io
import json
from typing import Any

from rich.console import Console
from rich.table import Table

from fitjax.planner._measure import Measured
from fitjax.planner._targets import Target
from fitjax.step.offload import offloaded_fields

__all__ = ["Plan", "human_bytes"]


def human_bytes(n: float | None) -> str:
    """`n` bytes with a binary unit ("1.5 GiB")."""
    if n is None:
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{int(n)} B" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _flops(n: float | None) -> str:
    if n is None:
        return "?"
    for unit in ("", "K", "M", "G", "T", "P"):
        if n < 1000 or unit == "P":
            return f"{n:.3g} {unit}FLOP"
        n /= 1000
    raise AssertionError("unreachable")


@dataclasses.dataclass(frozen=True)
class Plan:
    """What `Trainer.plan` found: each candidate's compiled step measured for the target.

    Attributes:
        target: the target's name ("local", "tpu-v5e-16", ...).
        devices: how many devices the step was compiled for.
        device_kind: their kind as XLA names it.
        spec_source: where the device kind's peak figures come from (None: no figures).
        candidates: every candidate that compiled, measured (per device).
        failed: `(candidate, error)` for those that did not compile.
        recommended: the one to train with (None when none fits).
        reason: why it was chosen (or why none was).
    """

    target: str
    devices: int
    device_kind: str
    spec_source: str | None
    candidates: tuple[Measured, ...]
    failed: tuple[tuple[str, str], ...]
    recommended: Measured | None
    reason: str

    @classmethod
    def of(cls, target: Target, measured, failed, recommended, reason) -> "Plan":
        return cls(target.name, len(target.devices), target.devices[0].device_kind,
                   target.spec.source if target.spec else None, tuple(measured), tuple(failed), recommended, reason)

    def as_dict(self) -> dict[str, Any]:
        """Plain data (`--json`): the candidates' figures in bytes, FLOPs and seconds."""
        return {"target": self.target, "devices": self.devices, "device_kind": self.device_kind,
                "spec_source": self.spec_source, "candidates": [m.as_dict() for m in self.candidates],
                "failed": [{"name": n, "error": e} for n, e in self.failed],
                "recommended": self.recommended.name if self.recommended else None, "reason": self.reason}

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=2)

    def table(self) -> Table:
        """The candidates as a rich table (bytes per device)."""
        limit = self.candidates[0].memory_limit if self.candidates else None
        headroom = self.candidates[0].headroom if self.candidates else 0.0
        fits_in = f"fits {human_bytes(limit * (1 - headroom))}?" if limit else "fits?"
        table = Table(title=f"plan for {self.target}: {self.devices} × {self.device_kind} (per device)",
                      title_justify="left")
        for column in ("candidate", "params", "optimizer", "temporaries", "peak", fits_in, "model FLOPs",
                       "XLA FLOPs", "collectives", "step (est.)", "MFU (est.)"):
            table.add_column(column, justify="left" if column == "candidate" else "right",
                             no_wrap=column == "candidate")
        for m in self.candidates:
            mark = "* " if m is self.recommended else ""
            fits = {True: "yes", False: "NO", None: "?"}[m.fits]
            wire = sum(c.wire_bytes for c in m.collectives.values())
            mesh = " ".join(f"{axis}={size}" for axis, size in m.mesh.items())  # the strategy's axes
            host = offloaded_fields(m.offload)  # kept in host memory: not in the device's peak
            table.add_row(f"{mark}{m.name}\n{mesh}",
                          human_bytes(m.memory["params"]) + (" (host)" if "params" in host else ""),
                          human_bytes(m.memory["optimizer"]) + (" (host)" if "opt_state" in host else ""),
                          human_bytes(m.memory["temporaries"]), human_bytes(m.memory["peak"]), fits,
                          f"{_flops(m.model_flops)} ({m.model_flops_source})", _flops(m.xla_flops), human_bytes(wire),
                          "?" if m.step_time_s is None else f"{m.step_time_s * 1e3:.3g} ms",
                          "?" if m.mfu is None else f"{m.mfu:.1%}")
        return table

    def render(self, width: int = 140) -> str:
        """The table, the failures and the recommendation as text."""
        out = io.StringIO()
        console = Console(file=out, width=width, force_terminal=False, color_system=None)
        console.print(self.table())
        for name, error in self.failed:
            console.print(f"{name}: did not compile: {error}")
        if self.recommended is not None:
            console.print(f"recommended: {self.recommended.name}: {self.reason}")
        else:
            console.print(f"no recommendation: {self.reason}")
        console.print("collectives: bytes each device sends (ring algorithms); step and MFU: roofline estimates, "
                      "max(FLOPs / peak, bytes accessed / memory bandwidth) + collective bytes / interconnect"
                      + (f"; device figures: {self.spec_source}" if self.spec_source
                         else "; no peak figures for this device kind"))
        return out.getvalue()

    def __str__(self) -> str:
        return self.render()
