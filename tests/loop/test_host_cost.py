"""A guard on the loop's host cost per train step, counted (not timed) so a loaded machine cannot
move it: the Python calls and hook calls of each step, and no implicit device-to-host transfer,
in a short fit with the defaults on (progress bar, TensorBoard, the default checkpoint) fed by an
in-memory `fj.DataLoader`.

On a small model the loop's own host work is a large share of each step (the tiny MLP's step is
~70 µs of CPU: `python benchmarks/host_profile.py`), so a change that adds work to every step
must show here. When one does on purpose, measure it with `benchmarks/host_profile.py` and raise
the bound below in the same commit, saying why.
"""

from __future__ import annotations

import statistics
import sys

import jax
import numpy as np
import pytest
from helpers import Regressor, regression_data

import fitjax as fj
from fitjax.loop._log_fetch import Window
from fitjax.loop.progress import Progress

# Python calls (functions and generator resumptions: fitjax's, JAX's, the standard library's)
# in a train step that is not a log step, with the defaults on: the loop, the progress bar's and
# the default checkpoint's per-step hooks and their dispatch, and the step's call (16 of them
# were JAX's, for the train state's random key, until 16 below). 66 before issue 40's changes, 48 after; 78 once the
# one road of logged values (issue 35) ran each callback's hook in its own `collecting()` block
# with the host model installed (15 calls per hook); 38 since fitjax's own per-step hooks are
# marked `plain_hook` and called directly (one call for the two, none of those blocks); 36 since
# the default checkpoint (epoch-end saves, each waited for) has no per-step hook (32 measured
# then); 28 since a lone plain hook is called as its bound method, no batch is made for hooks
# that ignore it, and the bar (here printing plain lines) looks for an arrived log window only
# from the next possible log step on (drawn live, it reads the clock between its redraws); 16
# since the step's program takes the state's random key beside the state and does not return
# it (`fitjax.step.jitted.KeyAside`: JAX made the returned typed key again in Python).
CALLS_PER_STEP = 16
HOOK_CALLS_PER_STEP = 1  # on_train_batch_end of the progress bar


class _Busy(fj.Callback):
    """One more per-step hook doing a little work (the guard must see it)."""

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        trainer.progress.crossed(7)


class _StepCounter(fj.Callback):
    """Counts the Python calls of each train step of epoch 1 (epoch 0 compiles), from one call
    of the loop's `Progress.advance` to the next (the loop calls it once a step), and the hook
    calls among them; runs that epoch with implicit transfers from the device to the host
    disallowed: a value read on the host every step would make the host wait for the device
    every step (the explicit `device_get` of a log step is allowed). Epoch hooks only: the
    counter adds nothing to a step."""

    def __init__(self):
        self.per_step: list[int] = []
        self.hooks: list[int] = []
        self._calls = self._hook_calls = 0
        self._mark = None
        self._guard = None

    def _count(self, frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        if code is _ADVANCE:
            if self._mark is not None:
                self.per_step.append(self._calls - self._mark[0])
                self.hooks.append(self._hook_calls - self._mark[1])
            self._mark = (self._calls, self._hook_calls)
        self._calls += 1
        if code.co_name.startswith("on_train_batch"):
            self._hook_calls += 1

    def on_train_epoch_start(self, trainer, module):
        if trainer.current_epoch == 1:
            self._guard = jax.transfer_guard_device_to_host("disallow")
            self._guard.__enter__()
            sys.setprofile(self._count)

    def on_train_epoch_end(self, trainer, module):
        if self._guard is not None:
            sys.setprofile(None)
            self._guard.__exit__(None, None, None)
            self._guard = None


_ADVANCE = Progress.advance.__code__


def _count_per_step(tmp_path, *extra: fj.Callback) -> _StepCounter:
    data = regression_data(n=16 * 64)
    counter = _StepCounter()
    trainer = fj.Trainer(max_epochs=2, callbacks=[counter, *extra], default_root_dir=tmp_path,
                         strategy="single", log_every_n_steps=10)
    # Each log window is read at the step after its log step, as on a quiet machine: when a window
    # arrives depends on the device, and until it has the bar (printing plain lines) looks for it
    # at every step; on a loaded machine that could be most of them.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Window, "ready", lambda window: True)
        trainer.fit(Regressor(batchnorm=False), fj.DataLoader(data, batch_size=16, shuffle=True, drop_last=True))
    assert len(counter.per_step) == 63  # from each step of epoch 1 to the next
    return counter


def _check(counter: _StepCounter) -> None:
    """The guard: raises when a step that is not a log step costs more than the bounds."""
    calls = statistics.median(counter.per_step)
    assert calls <= CALLS_PER_STEP, (
        f"a train step now makes {calls} Python calls on the host (median over epoch 1), over the "
        f"bound of {CALLS_PER_STEP}: see tests/loop/test_host_cost.py's docstring")
    hooks = statistics.median(counter.hooks)
    assert hooks <= HOOK_CALLS_PER_STEP, f"{hooks} hook calls a step, over the bound of {HOOK_CALLS_PER_STEP}"


def test_a_train_step_with_the_defaults_on_stays_within_its_host_cost(tmp_path):
    counter = _count_per_step(tmp_path)
    _check(counter)
    # the log steps (every 10th) fetch their window and write the loggers: more calls, there only
    calls = statistics.median(counter.per_step)
    assert sum(n > calls + 20 for n in counter.per_step) >= 6


def test_the_guard_fails_with_one_more_hook_on_every_step(tmp_path):
    """Self-test: a callback adding one hook and one call to every step fails the guard."""
    counter = _count_per_step(tmp_path, _Busy())
    with pytest.raises(AssertionError, match="Python calls on the host"):
        _check(counter)
    assert statistics.median(counter.hooks) == HOOK_CALLS_PER_STEP + 1


class _LoggingCheckpoint(fj.ModelCheckpoint):
    """A subclass overriding a `plain_hook` without the mark: called the full way, so it logs."""

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        super().on_train_batch_end(trainer, module, outputs, batch, batch_idx)
        module.log("seen_step", float(trainer.global_step))


def test_the_direct_call_of_plain_hooks_changes_nothing_seen(tmp_path):
    """The direct call of fitjax's own per-step hooks changes nothing a user sees: a step's save
    (every 4 steps) runs the module's `on_save_checkpoint` with its model callable on the host, as
    from any other hook, and a subclass overriding the hook is called the full way: it logs."""
    seen = []

    class Saving(Regressor):
        def on_save_checkpoint(self, checkpoint):
            seen.append(np.asarray(self.model(np.ones((1, 8), np.float32), train=False)))

    data = regression_data(n=16 * 8)
    quiet = {"default_root_dir": tmp_path, "strategy": "single", "enable_progress_bar": False,
             "enable_model_summary": False, "logger": False}
    trainer = fj.Trainer(max_epochs=1, callbacks=[fj.ModelCheckpoint(every_n_train_steps=4)], **quiet)
    trainer.fit(Saving(batchnorm=False), fj.DataLoader(data, batch_size=16))
    assert len(seen) == 2 and seen[0].shape == (1, 1)  # saves at steps 4 and 8 (the epoch's end)
    trainer = fj.Trainer(max_epochs=1, callbacks=[_LoggingCheckpoint(every_n_train_steps=4)], **quiet)
    trainer.fit(Regressor(batchnorm=False), fj.DataLoader(data, batch_size=16))
    assert trainer.callback_metrics["seen_step"] == 8.0
