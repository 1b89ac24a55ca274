"""What lives for one fit dies with it: the train data's copy on the devices is freed when fit
returns (normally or by an error), and a second fit on the same Trainer starts from its own
data, not the first fit's."""

from __future__ import annotations

import gc

import jax
import numpy as np
import pytest

import fitjax as fj
from tests.helpers import Regressor, quiet_trainer, regression_data

N, D = 193, 7  # a shape no parameter or metric has: only the kept data can be this shape


def _data_copies() -> int:
    gc.collect()
    return sum(1 for a in jax.live_arrays() if a.shape == (N, D))


def test_the_train_datas_device_copy_is_freed_when_fit_returns():
    loader = fj.DataLoader(regression_data(n=N, d=D), batch_size=16, shuffle=True, seed=0)
    seen = []

    class Count(fj.Callback):
        def on_train_epoch_end(self, trainer, module):
            seen.append(_data_copies())

    before = _data_copies()
    trainer = quiet_trainer(max_epochs=2, strategy="single", callbacks=[Count()])
    trainer.fit(Regressor(batchnorm=False), loader)
    assert seen == [before + 1, before + 1]  # kept on the device during fit (a small step on CPU)
    assert _data_copies() == before  # and gone with the fit
    assert trainer.state is not None and trainer.global_step == 2 * (N // 16 + 1)


def test_a_failed_fit_frees_its_data_and_the_next_fit_trains_on_its_own_data():
    class Boom(fj.Callback):  # fails the first fit at its 4th step
        fired = False

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if batch_idx == 3 and not self.fired:
                self.fired = True
                raise RuntimeError("boom")

    before = _data_copies()
    trainer = quiet_trainer(max_epochs=1, strategy="single", callbacks=[Boom()])
    with pytest.raises(RuntimeError, match="boom"):
        trainer.fit(Regressor(batchnorm=False), fj.DataLoader(regression_data(n=N, d=D), batch_size=16))
    assert _data_copies() == before

    # the same trainer fits again on other data: that fit's own loader and batch count, and the
    # counters go on from where the failed fit stopped (4 steps into epoch 0)
    assert trainer.global_step == 4 and trainer.current_epoch == 0
    trainer.fit(Regressor(batchnorm=False), fj.DataLoader(regression_data(n=96, d=D, seed=4), batch_size=16))
    assert trainer.num_training_batches == 6 and trainer.global_step == 4 + 6
    assert np.isfinite(trainer.callback_metrics["train/loss"])
