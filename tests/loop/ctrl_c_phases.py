"""Ctrl-C at every phase of a fit, and of a generation, in one process, for
`test_ctrl_c_phases.py`: `python ctrl_c_phases.py PHASE [PHASE ...]`. Each phase but the last is a
fit (or a generation) that sends SIGINT to its own process at that phase and catches the
`Interrupted` it ends with, printing "phase NAME: Interrupted 130 ..."; the last phase's
`Interrupted` ends the program, as a user's Ctrl-C does.

Phases: "setup" (the fit's first hook, after its argument checks), "init" (the state's
initialisation: `configure_optimizer`), "compile" (inside XLA's compilation of the train step: a
thread watches the main thread's stack and sends SIGINT once it is there), "first_step" and "step" (a host callback
inside the 1st and the 5th train step), "validation", "save" (the epoch-end checkpoint),
"teardown" (the fit's last hook), "jit" (inside the compilation of
the script's own `jax.jit`, outside a fit), "generate" (0.3 s into a long generation whose programs are
compiled: it must stop within about a second, with the tokens made so far on the `Interrupted`).
"""

from __future__ import annotations

import linecache
import os
import signal
import sys
import threading
import time
import warnings
from pathlib import Path

import jax
import jax.monitoring
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers import Regressor, TinyLM, TinyLMModule, regression_data  # noqa: E402

import fitjax as fj  # noqa: E402
from fitjax import _ctrl_c  # noqa: E402
from fitjax.loop import Interrupted  # noqa: E402

STEP = {"first_step": 1, "step": 5}  # the train step whose host callback sends SIGINT
SLOW_COMPILE = 200  # unrolled operations in phase "jit"'s program: a 0.5 s compilation on 2 CPU cores


def ctrl_c() -> None:
    os.kill(os.getpid(), signal.SIGINT)


def ctrl_c_when_compiling() -> None:
    """From a thread: SIGINT once the main thread is inside JAX's call to XLA's compiler (seen
    when that call lets go of the GIL: its wait for the compilation, where jaxlib checks for
    Ctrl-C)."""
    main = threading.main_thread().ident

    def watch():
        while not _ctrl_c.compiling(sys._current_frames().get(main)):
            time.sleep(0.0005)
        ctrl_c()

    threading.Thread(target=watch, daemon=True).start()


class Model(Regressor):
    def __init__(self, phase: str):
        super().__init__()
        self.phase = phase
        self.executed = 0

    def loss(self, model, batch):
        if self.training:
            jax.debug.callback(self._tick)
        return super().loss(model, batch)

    def _tick(self) -> None:
        self.executed += 1
        if self.executed == STEP.get(self.phase):
            ctrl_c()

    def configure_optimizer(self):
        if self.phase == "init":
            ctrl_c()
        return super().configure_optimizer()


class SendCtrlC(fj.Callback):
    def __init__(self, phase: str):
        self.phase = phase

    def setup(self, trainer, module, stage):
        if self.phase == "setup":
            ctrl_c()

    def on_train_start(self, trainer, module):
        if self.phase == "compile":  # the next compilation is the train step's, at its first call
            ctrl_c_when_compiling()

    def on_validation_batch_start(self, trainer, module, batch, batch_idx, dataloader_idx=0):
        if self.phase == "validation" and not trainer.sanity_checking:
            ctrl_c()

    def on_save_checkpoint(self, trainer, module, checkpoint):
        if self.phase == "save":
            ctrl_c()

    def teardown(self, trainer, module, stage):
        if self.phase == "teardown":
            ctrl_c()


class LongLM(TinyLMModule):
    """`TinyLMModule` with room for a long generation (learned positions: 20,000)."""

    def __init__(self):
        super().__init__()
        self.model = TinyLM(context=20_000)


def fit(phase: str, out: Path) -> None:
    train = fj.DataLoader(regression_data(n=64), batch_size=16)  # 4 steps an epoch
    val = fj.DataLoader(regression_data(n=32, seed=1), batch_size=32)
    trainer = fj.Trainer(max_epochs=3, devices=1, default_root_dir=str(out), enable_model_summary=False,
                         callbacks=[SendCtrlC(phase)])
    trainer.fit(Model(phase), train, val)


class _AfterDecodeCompiles:
    """Sends Ctrl-C once XLA has compiled the generation's decode program (the listener runs in
    the main thread, right after the compilation, inside `generation.generate`'s call of it)."""

    armed = False

    @classmethod
    def compiled(cls, event: str, seconds: float, **kwargs) -> None:
        frame = sys._getframe()
        while frame is not None and not (frame.f_code.co_name == "generate"
                                         and frame.f_code.co_filename.endswith("generation.py")):
            frame = frame.f_back
        if cls.armed and frame is not None and event.endswith("backend_compile_duration") \
                and "decode(" in linecache.getline(frame.f_code.co_filename, frame.f_lineno):
            cls.armed = False
            ctrl_c()


def generate(out: Path) -> None:
    """A long generation sent Ctrl-C 0.3 s in, measured; before it, the same generation stopped
    by a Ctrl-C once its programs are compiled."""
    warnings.filterwarnings("ignore", message=".*never fitted nor loaded")
    jax.monitoring.register_event_duration_secs_listener(_AfterDecodeCompiles.compiled)
    trainer = fj.Trainer(devices=1, default_root_dir=str(out), logger=False, enable_progress_bar=False)
    module = LongLM()
    _AfterDecodeCompiles.armed = True
    try:
        trainer.generate(module, [[1, 2, 3]], max_new_tokens=19_000, temperature=0)
    except Interrupted:
        pass
    threading.Timer(0.3, ctrl_c).start()
    begun = time.monotonic()
    try:
        trainer.generate(module, [[1, 2, 3]], max_new_tokens=19_000, temperature=0)
    finally:
        print(f"generate: stopped {time.monotonic() - begun - 0.3:.2f} s after Ctrl-C", flush=True)


def slow_compile(x):
    for _ in range(SLOW_COMPILE):
        x = jnp.sin(x) * 0.5 + jnp.cos(x @ x.T)
    return x


def jit() -> None:
    """A script's own `jax.jit`, outside any fit, whose compilation the Ctrl-C lands in."""
    ctrl_c_when_compiling()
    jax.jit(slow_compile)(jnp.ones((8, 8)))


def run(phase: str, out: Path) -> None:
    if phase == "generate":
        generate(out)
    elif phase == "jit":
        jit()
    else:
        fit(phase, out)
    print(f"phase {phase}: returned", flush=True)  # never: Ctrl-C ends each


if __name__ == "__main__":
    out = Path(sys.argv[1])
    *caught, last = sys.argv[2:]
    for i, phase in enumerate(caught):
        try:
            run(phase, out / f"{i}-{phase}")
        except Interrupted as exc:
            made = getattr(exc, "generated", None)
            print(f"phase {phase}: Interrupted {exc.code}" + ("" if made is None else f" with {len(made[0])} "
                                                                                      "tokens"), flush=True)
    run(last, out / last)
