"""A tiny fit that sends Ctrl-C (SIGINT) to its own process at a chosen phase, for
`test_ctrl_c.py`: `python ctrl_c_fit.py OUT_DIR PHASE`. Sending it from inside the fit makes the
phase exact, where a timer would hit whatever runs on a loaded machine.

Phases: "compile" (the train step's XLA compilation, from JAX's compile-time event), "step" (a
host callback inside the 11th train step: the signal lands while the step holds the state),
"validation" (epoch 1's validation), "save" (the epoch-0 checkpoint's save, and again the save
that the shutdown makes). The test runs "compile" through `fitjax fit --debug` instead, with
`Model`, `Data` and `SendCtrlC` named by class path."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import jax
import jax.monitoring

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers import Regressor, regression_data  # noqa: E402

import fitjax as fj  # noqa: E402

EPOCHS = 3
STEP_SIGNALLED = 11  # the train step whose host callback sends SIGINT ("step")


def ctrl_c() -> None:
    os.kill(os.getpid(), signal.SIGINT)


class Model(Regressor):
    """`Regressor` with a host callback in its train step, which sends Ctrl-C in the
    `STEP_SIGNALLED`-th step of phase "step" (every run compiles it, so all are alike)."""

    def __init__(self, phase: str | None = None):
        """Args:
            phase: "step" sends Ctrl-C in a train step; anything else, none."""
        super().__init__()
        self.phase = phase
        self.executed = 0

    def loss(self, model, batch):
        if self.training:
            jax.debug.callback(self._tick)
        return super().loss(model, batch)

    def _tick(self) -> None:
        self.executed += 1
        if self.phase == "step" and self.executed == STEP_SIGNALLED:
            ctrl_c()


class SendCtrlC(fj.Callback):
    """Sends Ctrl-C at `phase` (the train step's is `Model`'s)."""

    def __init__(self, phase: str):
        self.phase = phase
        self.saves = 0

    def on_train_start(self, trainer, module):
        if self.phase == "compile":  # the next compilation is the train step's, at its first call
            jax.monitoring.register_event_duration_secs_listener(self._compiled)

    def _compiled(self, event: str, seconds: float, **kwargs) -> None:
        if event.endswith("backend_compile_duration") and self.phase == "compile":
            self.phase = None
            ctrl_c()

    def on_validation_batch_start(self, trainer, module, batch, batch_idx, dataloader_idx=0):
        if self.phase == "validation" and trainer.current_epoch == 1 and not trainer.sanity_checking:
            ctrl_c()

    def on_save_checkpoint(self, trainer, module, checkpoint):
        if self.phase == "save":  # the epoch-end save, then the shutdown's save: Ctrl-C in both
            self.saves += 1
            ctrl_c()


def data():
    train = regression_data(n=128)  # 8 batches of 16: 8 steps an epoch
    return fj.DataLoader(train, batch_size=16, shuffle=True), fj.DataLoader(regression_data(n=64, seed=1), batch_size=32)


class Data(fj.DataModule):
    """`data()` for `fitjax fit --data.class_path ctrl_c_fit.Data`."""

    def train_dataloader(self):
        return data()[0]

    def val_dataloader(self):
        return data()[1]


def trainer(out: Path, **kwargs) -> fj.Trainer:
    return fj.Trainer(max_epochs=EPOCHS, devices=1, default_root_dir=str(out), log_every_n_steps=4, **kwargs)


if __name__ == "__main__":
    out, phase = Path(sys.argv[1]), sys.argv[2]
    trainer(out, callbacks=[SendCtrlC(phase)]).fit(Model(phase), *data())
    print("fit returned")  # never: Ctrl-C ends the program
