"""LambdaCallback calls the function passed for each hook, as Lightning's does.

Mirrors Lightning 2.6's tests/tests_pytorch/callbacks/test_lambda_function.py: a function for every
hook, a fit interrupted by an exception, then validate, test and predict; every hook was called.
"""

from __future__ import annotations

import doctest
import tempfile
from functools import partial

import pytest
from helpers import Regressor, quiet_trainer, regression_data

import fitjax as fj
from fitjax.callbacks import _base, lambda_callback


class Boom(Exception):
    pass


class FailsInSecondEpoch(Regressor):
    def on_train_epoch_start(self):
        if self.trainer.current_epoch > 0:
            raise Boom("raised to reach the on_exception hooks")


class Recorder(fj.Callback):
    """The same hooks written as a subclass: the order a LambdaCallback must reproduce."""


def _record(calls, hook, *args):
    calls.append(hook)


for _hook in _base.HOOKS:
    setattr(Recorder, _hook, lambda self, *args, _h=_hook: self.calls.append(_h))


def _run(*callbacks):
    data = fj.DataLoader(regression_data(n=32), batch_size=16)
    module = FailsInSecondEpoch()
    with tempfile.TemporaryDirectory() as folder:  # a checkpoint: on_save_checkpoint, then on_load_checkpoint
        saving = fj.ModelCheckpoint(folder, save_last=True, save_top_k=0)
        quiet_trainer(max_epochs=1, strategy="single", log_every_n_steps=2, enable_checkpointing=True,
                      callbacks=[*callbacks, saving]).fit(module, data, data)
        trainer = quiet_trainer(max_epochs=2, strategy="single", log_every_n_steps=2, callbacks=list(callbacks))
        with pytest.raises(Boom):  # the second epoch raises: on_exception
            trainer.fit(module, data, data)
        trainer.validate(module, data, ckpt_path=saving.last_model_path)
    trainer.test(module, data)
    trainer.predict(module, data)


def test_every_hook_is_called_in_the_order_a_subclass_gets():
    calls = []
    recorder = Recorder()
    recorder.calls = []
    _run(fj.LambdaCallback(**{hook: partial(_record, calls, hook) for hook in _base.HOOKS}), recorder)
    assert set(calls) == set(_base.HOOKS)
    assert calls == recorder.calls


def test_hooks_receive_the_trainer_module_and_the_hooks_arguments():
    seen = []
    callback = fj.LambdaCallback(
        on_train_batch_end=lambda trainer, module, outputs, batch, batch_idx: seen.append(
            (trainer.global_step, batch_idx, sorted(outputs), type(module).__name__)),
        on_fit_end=None,  # None leaves the hook out, as in Lightning
    )
    assert fj.callbacks.CallbackList([callback]).wants("on_train_batch_end")
    assert not fj.callbacks.CallbackList([callback]).wants("on_fit_end")
    quiet_trainer(max_steps=3, strategy="single", callbacks=[callback]).fit(
        Regressor(), fj.DataLoader(regression_data(n=48), batch_size=16))
    assert [(s, i, m) for s, i, _, m in seen] == [(1, 0, "Regressor"), (2, 1, "Regressor"), (3, 2, "Regressor")]
    assert "loss" in seen[0][2]


def test_an_unknown_hook_name_is_an_error_listing_the_valid_ones():
    with pytest.raises(TypeError, match=r"'on_trian_epoch_end'.*on_train_epoch_end"):
        fj.LambdaCallback(on_trian_epoch_end=print)
    with pytest.raises(TypeError, match=r"LambdaCallback\(setup=\.\.\.\) must be callable or None, got 3"):
        fj.LambdaCallback(setup=3)


def test_docstring_example_runs():
    results = doctest.testmod(lambda_callback)
    assert results.failed == 0 and results.attempted > 0
