"""The first of two fits on one checkpoint folder: `python two_fits_child.py FOLDER`.

Saves at every one of its 12 steps (top 2 kept), each step made slow (0.25 s), so a second fit
starts while it runs; prints `saved <path>` for each save it made and `done` at the end."""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from helpers import Regressor, quiet_trainer, regression_data  # noqa: E402

import fitjax as fj  # noqa: E402


class Slow(fj.Callback):
    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        time.sleep(0.25)


ckpt = fj.ModelCheckpoint(sys.argv[1], every_n_train_steps=1, save_top_k=2)
trainer = quiet_trainer(max_steps=12, strategy="single", enable_checkpointing=True, callbacks=[Slow(), ckpt])
trainer.fit(Regressor(batchnorm=False), fj.DataLoader(regression_data(n=64), batch_size=16))
print("last", Path(ckpt.last_model_path).name)
print("done")
