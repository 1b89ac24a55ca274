"""Trainer(overfit_batches=...): the first n train batches every epoch, in order, and the first n
validation batches, as Lightning 2.6 does; with dp and fsdp and an exact resume."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import Regressor, assert_trees_close, quiet_trainer

import fitjax as fj
from fitjax.strategies import FSDP

# Lightning 2.6 (/work/lvenv, torch CPU): x = arange(40) as [40, 1] in a torch DataLoader(batch_size=4,
# shuffle=True), validation x = 100 + arange(24) (batch 4), `L.Trainer(max_epochs=2, overfit_batches=of,
# num_sanity_val_steps=0)`; the first x of each batch `training_step` / `validation_step` received,
# per epoch, and the warning it gave:
LIGHTNING = {
    3: {"train": [0, 4, 8], "val": [100, 104, 108]},
    0.25: {"train": [0, 4], "val": [100]},  # int(10 * 0.25) train batches, int(6 * 0.25) val batches
}
LIGHTNING_WARNING = ("You requested to overfit but enabled train dataloader shuffling. We are turning off "
                     "the train dataloader shuffling for you.")


pytestmark = pytest.mark.usefixtures("compile_cache")  # tests/conftest.py


def _data(n, start=0):
    x = (start + np.arange(n, dtype=np.float32))[:, None]
    return {"x": x, "y": x * 0.01}


class Seen(fj.Callback):
    """The first x of each batch the train and validation steps ran on, per epoch."""

    def __init__(self):
        self.train, self.val = [], []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.train.append((trainer.current_epoch, float(np.asarray(batch["x"])[0, 0])))

    def on_validation_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.val.append((trainer.current_epoch, float(np.asarray(batch["x"])[0, 0])))


def _per_epoch(seen, epochs=2):
    return [[x for e, x in seen if e == epoch] for epoch in range(epochs)]


@pytest.mark.parametrize("overfit", [3, 0.25])
@pytest.mark.parametrize("kind", ["fitjax", "torch"])
def test_overfit_batches_matches_lightning(overfit, kind):
    seen = Seen()
    if kind == "fitjax":
        train = fj.DataLoader(_data(40), batch_size=4, shuffle=True)
    else:
        tensors = [torch.as_tensor(v) for v in _data(40).values()]
        ds = torch.utils.data.TensorDataset(*tensors)
        train = torch.utils.data.DataLoader(ds, batch_size=4, shuffle=True,
                                            collate_fn=lambda rows: {"x": np.stack([r[0].numpy() for r in rows]),
                                                                     "y": np.stack([r[1].numpy() for r in rows])})
    trainer = quiet_trainer(max_epochs=2, overfit_batches=overfit, num_sanity_val_steps=0, callbacks=[seen], strategy="single",
                            limit_train_batches=7)  # overfit_batches takes its place, as in Lightning
    with pytest.warns(UserWarning, match=LIGHTNING_WARNING):
        trainer.fit(Regressor(batchnorm=False), train, fj.DataLoader(_data(24, start=100), batch_size=4))
    expected = LIGHTNING[overfit]
    assert _per_epoch(seen.train) == [expected["train"]] * 2
    assert _per_epoch(seen.val) == [expected["val"]] * 2
    assert trainer.num_training_batches == len(expected["train"])
    assert train.shuffle if kind == "fitjax" else True  # the user's loader is left as it was


def test_overfit_batches_under_dp_and_fsdp_trains_as_one_device():
    def fit(strategy):
        seen = Seen()
        trainer = quiet_trainer(max_epochs=3, overfit_batches=2, strategy=strategy, callbacks=[seen])
        with pytest.warns(UserWarning, match="turning off the train dataloader shuffling"):
            trainer.fit(Regressor(batchnorm=False), fj.DataLoader(_data(64), batch_size=8, shuffle=True),
                        fj.DataLoader(_data(32, start=100), batch_size=8))
        return trainer, seen

    single, seen = fit("single")
    assert _per_epoch(seen.train, 3) == [[0, 8]] * 3
    for strategy in ("dp", FSDP(min_size_to_shard=8)):
        sharded, seen_sharded = fit(strategy)
        assert _per_epoch(seen_sharded.train, 3) == [[0, 8]] * 3
        assert_trees_close(sharded.state.params, single.state.params, rtol=1e-5, atol=1e-6)


def test_overfit_batches_resumes_exactly(tmp_path):
    def fit(max_steps, ckpt_path=None):
        trainer = quiet_trainer(max_steps=max_steps, overfit_batches=3, enable_checkpointing=True, strategy="single",
                                callbacks=[fj.ModelCheckpoint(tmp_path, save_last=True, every_n_train_steps=4)])
        with pytest.warns(UserWarning, match="overfit"):
            trainer.fit(Regressor(batchnorm=False), fj.DataLoader(_data(40), batch_size=4, shuffle=True),
                        ckpt_path=ckpt_path)
        return trainer

    full = quiet_trainer(max_steps=7, overfit_batches=3, strategy="single")
    with pytest.warns(UserWarning, match="overfit"):
        full.fit(Regressor(batchnorm=False), fj.DataLoader(_data(40), batch_size=4, shuffle=True))
    fit(4)  # stops in epoch 1, after its first batch
    resumed = fit(7, ckpt_path="last")
    assert resumed.current_epoch == full.current_epoch
    assert_trees_close(resumed.state.params, full.state.params, rtol=0, atol=0)


def test_overfit_batches_rejects_what_lightning_rejects():
    with pytest.raises(ValueError, match=r"overfit_batches=.*int number of batches or a float fraction.*-1"):
        fj.Trainer(overfit_batches=-1)
    with pytest.raises(ValueError, match=r"overfit_batches=.*1.5"):
        fj.Trainer(overfit_batches=1.5)
