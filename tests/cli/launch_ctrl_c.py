"""One process of a launched fit that runs until Ctrl-C: the test sends SIGINT to `fitjax launch`
(as a terminal's Ctrl-C does) once every process trains. Writes OUT_DIR/training_<rank> once a step
ran, and OUT_DIR/stopped_<rank> (the step it stopped after) from the exception hook, which runs
before the shutdown's checkpoint."""

from __future__ import annotations

import sys
from pathlib import Path

import jax
from cli_parts import Regressor, RegressorData

import fitjax as fj


class Marks(fj.Callback):
    def __init__(self, out: Path):
        self.out = out

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step == 1:
            (self.out / f"training_{jax.process_index()}").touch()

    def on_exception(self, trainer, module, exception):
        (self.out / f"stopped_{jax.process_index()}").write_text(str(trainer.global_step))


def trainer(root: Path, **kwargs) -> fj.Trainer:
    return fj.Trainer(max_epochs=100_000, strategy="dp", default_root_dir=root, logger=False,
                      enable_model_summary=False, **kwargs)


if __name__ == "__main__":
    out = Path(sys.argv[1])
    # no validation: one program to compile, the sooner the test's Ctrl-C
    trainer(out, callbacks=[Marks(out)]).fit(Regressor(), RegressorData().train_dataloader())
    print("fit returned")  # never: Ctrl-C ends the program
