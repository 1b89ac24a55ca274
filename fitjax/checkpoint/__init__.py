"""Checkpoints: plain Orbax directories holding the whole train state and where the loop stood.

One checkpoint is one directory, written by Orbax and finalised atomically (it appears under its
name only once complete; a save killed half-way leaves a `*.orbax-checkpoint-tmp-*` folder that
fitjax ignores):

    checkpoints/epoch=3-step=32/
        state/     the TrainState as a plain dict of its fields that are not None: step, params,
                   model_state, opt_state, rng (as its raw uint32 key data), metrics (train
                   accumulators since the last log), loss_scale (with precision="16-mixed"), and
                   any field added to TrainState later, without code here
        meta/      JSON: the loop position (global step, epoch, batches done in it), the train
                   loader's state, callback and logger states, host-side epoch sums, hparams
        metrics/   JSON: the monitored value, when `ModelCheckpoint(monitor=...)` ranks saves

Reading the weights needs `orbax.checkpoint` alone, no fitjax:

    import os
    import orbax.checkpoint as ocp
    state = ocp.StandardCheckpointer().restore(os.path.abspath("checkpoints/epoch=3-step=32/state"))
    params = state["params"]            # the nested dict the flax model takes as {"params": ...}
    batch_stats = state["model_state"].get("batch_stats")   # Linen BatchNorm statistics, if any

Most users never call this module: `ModelCheckpoint` saves, `Trainer.fit(ckpt_path=...)` resumes,
`trainer.validate/test/predict(ckpt_path=...)` and `MyModule.load_from_checkpoint(path)` load.
"""

from fitjax.checkpoint._format import (
    CheckpointDamaged,
    SaveFailed,
    checkpoints_newest_first,
    composite_args,
    damage,
    incomplete_checkpoints,
    is_checkpoint,
    latest_checkpoint,
    local_path,
    module_init_args,
    read_meta,
    restore_state,
    restore_variables,
    save_args,
    saveable_tree,
    verify,
)

# For the other fitjax packages (the checkpoint callbacks, the loop's resume, the integrations),
# not part of the user-facing API: the folder's item names and checks, and the one writer per
# process that every save goes through (`_writer`).
from fitjax.checkpoint._format import META_ITEM, STATE_ITEM, TMP_MARK, check_path, folder_entries, jsonable
from fitjax.checkpoint._writer import CheckpointWriter, cleanup, import_orbax_soon, is_donated, prepare, writer
from fitjax.checkpoint._trainable import FROZEN_KEY, fingerprints, keep_trained
from fitjax.checkpoint._lease import FolderInUse
from fitjax.checkpoint._lease import release as release_folder, take as hold_folder

__all__ = ["CheckpointDamaged", "FolderInUse", "SaveFailed", "checkpoints_newest_first", "composite_args", "damage",
           "incomplete_checkpoints", "is_checkpoint", "latest_checkpoint", "local_path", "module_init_args",
           "read_meta", "restore_state", "restore_variables", "save_args", "saveable_tree", "verify"]
