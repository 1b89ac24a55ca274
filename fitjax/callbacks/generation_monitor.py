"""`GenerationMonitor`: what the model writes after fixed prompts, every n steps, in TensorBoard's
Text tab: the callback Lightning users write by hand for a language model."""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from fitjax._generation_options import GenerationOptions
from fitjax.callbacks._base import Callback, ignores_batch, ignores_outputs
from fitjax.loggers import TensorBoardLogger

__all__ = ["GenerationMonitor"]


class GenerationMonitor(Callback):
    """Generates continuations of `prompts` every `every_n_train_steps` optimizer steps (and when
    training ends) with `Trainer.generate`, and writes them as one table per step to the Text
    tab of every `TensorBoardLogger` (tag `samples`, through tensorboardX's `add_text`).

    Prompts are text when the module has a `tokenizer` (see `Trainer.generate`), else token id
    lists (the table then shows the ids). A generation is one compiled program reused at every
    call (the prompts stay the same), and one wait for its result: sample every few hundred steps.

    Args:
        prompts: the prompts, the same at every call.
        every_n_train_steps: generate when the global step passes a multiple of it (0: only when
            training ends).
        tag: the TensorBoard tag.
        **options: how to generate: `fj.GenerationOptions`' fields (`max_new_tokens`,
            `temperature`, `top_k`, `top_p`, `seed`, `eos_token_id`, `use_cache`), checked here;
            `temperature` is 0.8 unless given, and each call adds the global step to `seed`, so
            calls differ but a rerun repeats.

    Attributes:
        options: the `fj.GenerationOptions` every call uses (its seed plus the global step).
        history: `[(global_step, [continuation, ...]), ...]` of every call.

    Example:
        >>> import fitjax as fj
        >>> monitor = fj.GenerationMonitor(["Once upon a time", "def main("], every_n_train_steps=500, top_p=0.95)
        >>> trainer = fj.Trainer(max_steps=2000, callbacks=[monitor])
    """

    def __init__(self, prompts: Sequence[Any], *, every_n_train_steps: int = 500, tag: str = "samples",
                 **options: Any):
        if isinstance(prompts, str) or not len(prompts):
            raise ValueError(f"GenerationMonitor(prompts=...) must be a non-empty list of prompts (text or "
                             f"token id lists); got {prompts!r}.")
        if isinstance(every_n_train_steps, bool) or not isinstance(every_n_train_steps, int) or every_n_train_steps < 0:
            raise ValueError(f"GenerationMonitor(every_n_train_steps=...) must be an int >= 0 (0: only when "
                             f"training ends); got {every_n_train_steps!r}.")
        fields = [f.name for f in dataclasses.fields(GenerationOptions)]
        unknown = sorted(set(options) - set(fields))
        if unknown:
            raise TypeError(f"GenerationMonitor({unknown[0]}=...) is not an option; the generation options are "
                            f"`fj.GenerationOptions`' fields: {', '.join(fields)}.")
        self.prompts = list(prompts)
        self.every_n_train_steps = every_n_train_steps
        self.options = GenerationOptions(**{"temperature": 0.8, **options}, where="GenerationMonitor")
        self.tag = tag
        self.history: list[tuple[int, list[Any]]] = []

    @ignores_outputs
    @ignores_batch
    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        if trainer.progress.crossed(self.every_n_train_steps):
            self.sample(trainer, module)

    def on_train_end(self, trainer, module) -> None:
        if not self.history or self.history[-1][0] != trainer.global_step:
            self.sample(trainer, module)

    def sample(self, trainer, module) -> list[Any]:
        """Generates now, records the continuations in `history` and writes them; returns them."""
        step = trainer.global_step
        options = dataclasses.replace(self.options, seed=self.options.seed + step)
        continuations = trainer.generate(module, self.prompts, **dataclasses.asdict(options))
        self.history.append((step, continuations))
        text = _table(self.prompts, continuations)
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):  # the Text tab is TensorBoard's
                logger.experiment.add_text(self.tag, text, global_step=step)
        return continuations


def _table(prompts: Sequence[Any], continuations: Sequence[Any]) -> str:
    """A markdown table (TensorBoard's Text tab renders it): prompt | continuation."""
    def cell(value: Any) -> str:
        text = value if isinstance(value, str) else " ".join(str(t) for t in value)
        return text.replace("|", "\\|").replace("\n", "<br>") or " "

    rows = [f"| {cell(p)} | {cell(c)} |" for p, c in zip(prompts, continuations)]
    return "\n".join(["| prompt | continuation |", "|---|---|", *rows])
