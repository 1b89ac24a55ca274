"""`EMA`: an exponential moving average of the parameters, updated inside the jitted train step."""

from __future__ import annotations

from fitjax.callbacks._base import Callback
from fitjax.step.pieces import ExponentialMovingAverage

__all__ = ["EMA"]


class EMA(Callback):
    """Keeps `ema = decay * ema + (1 - decay) * params` after every `every_n_steps`-th optimizer step.

    Lightning's `EMAWeightAveraging(decay, update_every_n_steps)`. The average is one more entry
    of the train state (`trainer.state.extras[name]`), updated inside the jitted step (no host
    work, no extra dispatch), sharded like the parameters under every strategy (fsdp included),
    saved in checkpoints and restored bitwise on resume. Like torch's `AveragedModel` the first
    update (after optimizer step 0) copies the parameters; it is kept in float32.

    Args:
        decay: weight of the old average, in [0, 1).
        every_n_steps: update after optimizer steps 0, n, 2n, ...
        use_for_eval: validation, test and predict (during and after fit) use the average, and
            so do `validate/test/predict(ckpt_path=...)` and `load_from_checkpoint` on the
            checkpoints saved with it.
        apply_to_module: after fit, `module.variables` holds the average instead of the last
            parameters (Lightning's `WeightAveraging` always does this at the end of training).
        name: the key in `trainer.state.extras` (change it to keep two averages).

    Example:
        >>> import fitjax as fj
        >>> trainer = fj.Trainer(max_epochs=3, callbacks=[fj.EMA(decay=0.999)])
    """

    def __init__(self, decay: float = 0.999, every_n_steps: int = 1, use_for_eval: bool = True, *,
                 apply_to_module: bool = False, name: str = "ema"):
        if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0.0 <= decay < 1.0:
            raise ValueError(f"EMA(decay=...) must be a number in [0, 1), got {decay!r}; 0.999 is usual.")
        if isinstance(every_n_steps, bool) or not isinstance(every_n_steps, int) or every_n_steps < 1:
            raise ValueError(f"EMA(every_n_steps=...) must be a positive int, got {every_n_steps!r}.")
        if not isinstance(name, str) or not name:
            raise ValueError(f"EMA(name=...) must be a non-empty str, got {name!r}.")
        self.decay, self.every_n_steps, self.use_for_eval = float(decay), every_n_steps, bool(use_for_eval)
        self.apply_to_module, self.name = bool(apply_to_module), name

    def step_pieces(self) -> tuple[ExponentialMovingAverage]:
        return (ExponentialMovingAverage(self.name, decay=self.decay, every_n_steps=self.every_n_steps,
                                         use_for_eval=self.use_for_eval, use_for_module=self.apply_to_module),)

    @property
    def state_key(self) -> str:
        return f"EMA[{self.name}]"
