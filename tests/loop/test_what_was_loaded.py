"""What a run says about the weights it starts from: Lightning's "Restoring states from the checkpoint
path at ..." on resume, the checkpoint an evaluation loaded, and a warning when an evaluation would
score weights that were never trained nor loaded."""

from __future__ import annotations

import warnings

import pytest
from helpers import Regressor, quiet_trainer, regression_data

import fitjax as fj


def _data():
    return fj.DataLoader(regression_data(n=64), batch_size=16)


def test_resume_and_evaluation_say_which_checkpoint_they_loaded(tmp_path, capsys):
    trainer = quiet_trainer(max_epochs=1, strategy="single", default_root_dir=tmp_path, enable_checkpointing=True)
    trainer.fit(Regressor(), _data())
    ckpt = trainer.checkpoint_callback.last_model_path
    capsys.readouterr()
    resumed = quiet_trainer(max_epochs=2, strategy="single", default_root_dir=tmp_path)
    resumed.fit(Regressor(), _data(), ckpt_path=ckpt)
    quiet_trainer(strategy="single").validate(Regressor(), _data(), ckpt_path=ckpt, verbose=False)
    said = capsys.readouterr().out.splitlines()  # the "fitjax" logger prints to stdout
    # saved at the end of epoch 0 (4 batches): a resume continues with epoch 1's first batch
    assert f"Restoring states from the checkpoint path at {ckpt} (global step 4; epoch 1 from batch 0)" in said
    assert f"Loaded model weights from the checkpoint at {ckpt} (global step 4; epoch 1 from batch 0)" in said


def test_evaluating_weights_never_trained_nor_loaded_warns():
    with pytest.warns(UserWarning, match=r"Trainer.validate: Regressor was never fitted nor loaded; its weights "
                                         r"are freshly initialised"):
        quiet_trainer(strategy="single").validate(Regressor(), _data(), verbose=False)
    module, trainer = Regressor(), quiet_trainer(max_steps=2, strategy="single")
    trainer.fit(module, _data())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fitted module, even in another trainer: no warning
        quiet_trainer(strategy="single").validate(module, _data(), verbose=False)
