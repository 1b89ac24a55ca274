"""A fit whose save at step 4 meets a file-size limit of 3,000 bytes (as a full disk: the
checkpoint's small metadata files are written, the arrays' writes in Orbax's threads fail).
`python disk_full_child.py FOLDER`: stdout and stderr as a user sees them, then on stdout a count
of the fitjax logger's DEBUG records (kept in memory: no file can grow under the limit) and of
those that hold Orbax's tracebacks; run by tests/checkpoint/test_checkpoint_faults.py."""

from __future__ import annotations

import logging
import resource
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from helpers import Regressor, regression_data  # noqa: E402

import fitjax as fj  # noqa: E402


class FileSizeLimit(fj.Callback):
    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if trainer.global_step != 4:  # the save at step 4 runs on the writer's thread now
            return
        limits = resource.getrlimit(resource.RLIMIT_FSIZE)
        handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a kill
        resource.setrlimit(resource.RLIMIT_FSIZE, (3000, limits[1]))
        try:
            time.sleep(1.0)
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, limits)
            signal.signal(signal.SIGXFSZ, handler)


class Kept(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append(self.format(record))


fitjax_log, kept = logging.getLogger("fitjax"), Kept()
for handler in fitjax_log.handlers:
    handler.setLevel(logging.INFO)  # what a user sees stays as it is
fitjax_log.addHandler(kept)
fitjax_log.setLevel(logging.DEBUG)
ckpt = fj.ModelCheckpoint(sys.argv[1], every_n_train_steps=2, every_n_epochs=0, save_top_k=-1)
trainer = fj.Trainer(max_epochs=3, enable_checkpointing=True, callbacks=[ckpt, FileSizeLimit()],
                     enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=1)
try:
    trainer.fit(Regressor(batchnorm=False), fj.DataLoader(regression_data(n=96), batch_size=32))
except fj.checkpoint.SaveFailed as error:
    print(f"SaveFailed: {error}", file=sys.stderr)
time.sleep(1.0)  # tensorstore's last reports land after the failure is raised
orbax = sum("orbax/checkpoint" in text and "Traceback" in text for text in kept.records)
print(f"debug records: {len(kept.records)}, with Orbax's tracebacks: {orbax}")
