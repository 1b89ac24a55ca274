"""One process of a launched fit with stateful metrics (macro F1 from `training_step` and
`validation_step`, AUROC): writes OUT_DIR/metrics_<rank>.pkl, the logged values and the
validation rows this process's `validation_step_outputs` got."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import jax

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parent / "strategies")]  # helpers, multiprocess_data
from multiprocess_data import fit_metrics  # noqa: E402

import fitjax as fj  # noqa: E402

out = Path(sys.argv[1])
result = fit_metrics(fj.Trainer(max_epochs=2, strategy="dp", logger=False, enable_progress_bar=False,
                                enable_model_summary=False, enable_checkpointing=False, num_sanity_val_steps=0))
(out / f"metrics_{jax.process_index()}.pkl").write_bytes(pickle.dumps(result))
