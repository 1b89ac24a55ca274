"""`on_save_checkpoint` / `on_load_checkpoint` on callbacks and the module, and the eval
`on_*_batch_start` hooks, in Lightning 2.6's order.

How the expected orders were produced: Lightning 2.6.6 in a scratch venv, a `LightningModule`
(one `nn.Linear(3, 1)`) and a `Callback` each appending to one list from every hook below;
`Trainer(max_steps=2, num_sanity_val_steps=0, callbacks=[cb, ModelCheckpoint(save_last=True)])`
fitted on 2 batches with 2 validation batches, then a new Trainer fitted with
`ckpt_path="ck/last.ckpt"`, then `trainer.test` and `trainer.predict` on 2 batches. Seen:
- each save: `cb.state_dict`, `cb.on_save_checkpoint` (the dict already holds "callbacks"; the
  callback adds "cb_extra"), `module.on_save_checkpoint` (sees "cb_extra"; adds "mod_extra");
- the resume: `cb.setup`, `module.on_load_checkpoint` (both extras back), `cb.on_load_checkpoint`,
  `cb.load_state_dict({'n': 1})`, `cb.on_fit_start`, `cb.on_train_start`;
- per validation batch i: `cb.on_validation_batch_start i`, `module.on_validation_batch_start i`,
  (the step), `cb.on_validation_batch_end i`; `on_test_batch_start i` and `on_predict_batch_start i` before
  each test and predict step.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from helpers import LossHistory, Regressor, quiet_trainer, regression_data

import fitjax as fj


class Recorder(fj.Callback):
    def __init__(self, calls):
        self.calls, self.n = calls, 0

    def state_dict(self):
        self.calls.append("cb.state_dict")
        return {"n": 1}

    def load_state_dict(self, state):
        self.calls.append(f"cb.load_state_dict {state}")

    def on_save_checkpoint(self, trainer, module, checkpoint):
        self.calls.append(f"cb.on_save_checkpoint callbacks={'callbacks' in checkpoint}")
        checkpoint["cb_extra"] = {"a": 1}

    def on_load_checkpoint(self, trainer, module, checkpoint):
        self.calls.append(f"cb.on_load_checkpoint cb_extra={checkpoint.get('cb_extra')} "
                          f"mod={checkpoint.get('mod_extra')}")

    def setup(self, trainer, module, stage):
        self.calls.append("cb.setup")

    def on_fit_start(self, trainer, module):
        self.calls.append("cb.on_fit_start")

    def on_train_start(self, trainer, module):
        self.calls.append("cb.on_train_start")

    def on_validation_batch_start(self, trainer, module, batch, batch_idx):
        self.calls.append(f"cb.on_validation_batch_start {batch_idx}")

    def on_validation_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.calls.append(f"cb.on_validation_batch_end {batch_idx}")

    def on_test_batch_start(self, trainer, module, batch, batch_idx):
        self.calls.append(f"cb.on_test_batch_start {batch_idx}")

    def on_predict_batch_start(self, trainer, module, batch, batch_idx):
        self.calls.append(f"cb.on_predict_batch_start {batch_idx}")


class Keeping(Regressor):
    """Keeps host data of its own in checkpoints, as a Lightning module keeps a vocabulary."""

    def __init__(self, calls=None, **kwargs):
        super().__init__(**kwargs)
        self.calls = [] if calls is None else calls
        self.vocabulary = None

    def on_save_checkpoint(self, checkpoint):
        self.calls.append(f"module.on_save_checkpoint cb_extra={checkpoint.get('cb_extra')}")
        checkpoint["mod_extra"] = [1, 2]

    def on_load_checkpoint(self, checkpoint):
        self.calls.append(f"module.on_load_checkpoint mod={checkpoint.get('mod_extra')} "
                          f"cb={checkpoint.get('cb_extra')}")
        self.vocabulary = checkpoint.get("mod_extra")

    def on_validation_batch_start(self, batch, batch_idx, dataloader_idx=0):  # Lightning's signature
        self.calls.append(f"module.on_validation_batch_start {batch_idx}")

    def on_predict_batch_start(self, batch, batch_idx):
        self.calls.append(f"module.on_predict_batch_start {batch_idx}")


def _loader():
    return fj.DataLoader(regression_data(n=64), batch_size=32)  # 2 batches


def _trainer(tmp_path, calls, max_steps, strategy, name):
    return quiet_trainer(max_steps=max_steps, num_sanity_val_steps=0, strategy=strategy, enable_checkpointing=True,
                         callbacks=[Recorder(calls), LossHistory(),
                                    fj.ModelCheckpoint(tmp_path / name, save_last=True, save_top_k=0)])


@pytest.mark.parametrize("strategy", ["dp", "fsdp"])
def test_save_and_resume_call_the_hooks_in_lightnings_order_and_resume_exactly(tmp_path, strategy):
    calls = []
    trainer = _trainer(tmp_path, calls, 2, strategy, "first")
    trainer.fit(Keeping(calls), _loader(), _loader())
    save = ["cb.state_dict", "cb.on_save_checkpoint callbacks=True", "module.on_save_checkpoint cb_extra={'a': 1}"]
    assert calls == ["cb.setup", "cb.on_fit_start", "cb.on_train_start",
                     "cb.on_validation_batch_start 0", "module.on_validation_batch_start 0",
                     "cb.on_validation_batch_end 0",
                     "cb.on_validation_batch_start 1", "module.on_validation_batch_start 1",
                     "cb.on_validation_batch_end 1", *save]
    saved = fj.checkpoint.read_meta(trainer.checkpoint_callback.last_model_path)
    assert saved["cb_extra"] == {"a": 1} and saved["mod_extra"] == [1, 2]

    calls.clear()
    module = Keeping(calls)
    resumed = _trainer(tmp_path, calls, 4, strategy, "second")
    resumed.fit(module, _loader(), _loader(), ckpt_path=trainer.checkpoint_callback.last_model_path)
    assert calls[:6] == ["cb.setup", "module.on_load_checkpoint mod=[1, 2] cb={'a': 1}",
                         "cb.on_load_checkpoint cb_extra={'a': 1} mod=[1, 2]", "cb.load_state_dict {'n': 1}",
                         "cb.on_fit_start", "cb.on_train_start"]
    assert module.vocabulary == [1, 2]

    # the hooks leave the run exact: steps 3-4 of the resumed run are those of one fit of 4
    whole = quiet_trainer(max_steps=4, num_sanity_val_steps=0, strategy=strategy, callbacks=[LossHistory()])
    whole.fit(Keeping(), _loader(), _loader())
    history = lambda t: next(cb for cb in t.callbacks if isinstance(cb, LossHistory)).losses  # noqa: E731
    assert history(resumed) == history(whole)[2:]


def test_eval_batch_start_hooks_and_loading_a_checkpoint_for_eval_or_a_module(tmp_path):
    calls = []
    trainer, fitted = _trainer(tmp_path, calls, 2, "single", "first"), Keeping(calls)
    trainer.fit(fitted, _loader(), _loader())
    path = trainer.checkpoint_callback.last_model_path

    calls.clear()
    trainer.test(Keeping(calls), _loader(), ckpt_path=path, verbose=False)
    assert calls[:3] == ["cb.setup", "module.on_load_checkpoint mod=[1, 2] cb={'a': 1}",
                         "cb.on_load_checkpoint cb_extra={'a': 1} mod=[1, 2]"]
    assert [c for c in calls if "batch_start" in c] == ["cb.on_test_batch_start 0", "cb.on_test_batch_start 1"]

    calls.clear()
    trainer.predict(Keeping(calls), _loader(), ckpt_path=path)
    assert [c for c in calls if "batch_start" in c] == ["cb.on_predict_batch_start 0", "module.on_predict_batch_start 0",
                                                        "cb.on_predict_batch_start 1", "module.on_predict_batch_start 1"]

    calls.clear()  # the same order in a fit whose profiler times each hook
    quiet_trainer(max_steps=2, num_sanity_val_steps=0, profiler="simple", default_root_dir=tmp_path,
                  callbacks=[Recorder(calls)]).fit(
        Keeping(calls), _loader(), _loader())
    assert [c for c in calls if "batch_start" in c] == [
        "cb.on_validation_batch_start 0", "module.on_validation_batch_start 0",
        "cb.on_validation_batch_start 1", "module.on_validation_batch_start 1"]

    loaded = Keeping.load_from_checkpoint(path)
    assert loaded.vocabulary == [1, 2]
    for a, b in zip(jax.tree.leaves(loaded.variables[0]), jax.tree.leaves(fitted.variables[0]), strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_hook_that_stores_an_array_is_told_to_store_plain_data(tmp_path):
    class Bad(Regressor):
        def on_save_checkpoint(self, checkpoint):
            checkpoint["table"] = np.zeros(3)

    trainer = quiet_trainer(max_steps=1, enable_checkpointing=True, callbacks=[fj.ModelCheckpoint(tmp_path, save_last=True, save_top_k=0)])
    with pytest.raises(TypeError, match=r"not JSON data under \['table'\].*on_save_checkpoint hook of Bad"):
        trainer.fit(Bad(), _loader())
