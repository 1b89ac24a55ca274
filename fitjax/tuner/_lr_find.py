"""The learning-rate range test (Lightning's `Tuner.lr_find`) and its result."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np

from fitjax.step.pieces import StatePiece

__all__ = ["ImposedRate", "LRFinder", "lr_values"]

_MODES = ("exponential", "linear")


def lr_values(min_lr: float, max_lr: float, num_training: int, mode: str) -> np.ndarray:
    """The learning rate of each of the `num_training` steps, from `min_lr` to `max_lr`."""
    t = np.arange(num_training) / max(num_training - 1, 1)
    if mode == "exponential":
        return min_lr * (max_lr / min_lr) ** t
    return min_lr + (max_lr - min_lr) * t


class ImposedRate(StatePiece):
    """The learning rate lr_find imposes on each update of an optimizer that follows the module's
    `lr_schedule`: a float32 scalar of the state (`extras[name]`), set from the host before each
    step, so every rate runs the same compiled step (`fitjax.step.learning_rate.update`)."""

    def __init__(self, name: str = "lr_find"):
        self.name = name

    def init(self, params):
        return jnp.full((), jnp.nan, jnp.float32)  # NaN: the optimizer's own, until set

    def update(self, extra, params, step):
        return extra

    def learning_rate(self, extra) -> jax.Array:
        return extra

    def set_host(self, extras: dict, lr: float) -> dict:
        """`extras` with this piece's rate set to the host number `lr`, placed as the value it replaces."""
        old = extras[self.name]
        return {**extras, self.name: jax.device_put(np.float32(lr), old.sharding)}


class LRFinder:
    """What `Tuner.lr_find` measured: `results = {"lr": [...], "loss": [...]}` (the loss smoothed
    as Lightning smooths it: an exponential average with bias correction, beta 0.98).

    Example:
        >>> # finder = fj.Tuner(trainer).lr_find(module, train_loader)
        >>> # lr = finder.suggestion(); fig = finder.plot(suggest=True)
    """

    def __init__(self, mode: str, lrs: list[float], losses: list[float], log_dir: str | None):
        self.mode = mode
        self.results = {"lr": list(lrs), "loss": list(losses)}
        self.log_dir = log_dir
        self.plot_path: str | None = None
        self._optimal_idx: int | None = None

    def suggestion(self, skip_begin: int = 10, skip_end: int = 1) -> float | None:
        """The learning rate where the smoothed loss falls fastest (its most negative difference
        per step), skipping the first `skip_begin` and last `skip_end` points, as Lightning does.
        None when fewer than two finite points remain."""
        losses = np.asarray(self.results["loss"], np.float64)
        index = np.arange(len(losses))[skip_begin:len(losses) - skip_end]
        finite = index[np.isfinite(losses[index])]
        if len(finite) < 2:
            self._optimal_idx = None
            return None
        self._optimal_idx = int(finite[np.argmin(np.gradient(losses[finite]))])
        return float(self.results["lr"][self._optimal_idx])

    def plot(self, suggest: bool = False, *, path: str | os.PathLike | None = None):
        """A matplotlib figure of loss against learning rate (log scale in "exponential" mode), the
        suggestion marked when `suggest`; also saved as PNG at `path` (default
        `<log dir>/lr_find.png`; `.plot_path` says where)."""
        try:
            from matplotlib.figure import Figure
        except ImportError as exc:  # an optional extra
            raise ImportError("LRFinder.plot needs matplotlib: `pip install 'fitjax[plot]'`.") from exc
        fig = Figure(figsize=(6, 4))
        ax = fig.subplots()
        ax.plot(self.results["lr"], self.results["loss"])
        if self.mode == "exponential":
            ax.set_xscale("log")
        ax.set_xlabel("Learning rate")
        ax.set_ylabel("Loss")
        if suggest:
            lr = self.suggestion()
            if lr is not None:
                ax.plot(lr, self.results["loss"][self._optimal_idx], markersize=10, marker="o", color="red")
        path = path if path is not None else os.path.join(self.log_dir or os.getcwd(), "lr_find.png")
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        fig.savefig(path)  # no pyplot: the Agg canvas, no display needed
        self.plot_path = os.fspath(path)
        return fig
