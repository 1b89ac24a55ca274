"""`LitModule`, what the user writes to declare what to train, and what it is built from: its
weight methods (loading, saving, LoRA), the Lightning-style adapter (`training_step`, `self.log`
options, manual optimization), the hyperparameters `save_hyperparameters` collects, what
`configure_optimizers` may return, and the model host code calls with the trainer's current
weights."""

from fitjax.module._lit_module import LitModule
from fitjax.module._param_groups import param_groups

# What fitjax's loop, callbacks and checkpoints do with a module (functions, so that they take no
# names from the user's subclass): which hooks it defines, Lightning's train/eval mode around host
# hooks, and its weights.
from fitjax.module._host_model import hook_mode
from fitjax.module import _hooks as hook_table  # every Lightning hook: called, traced or refused
from fitjax.module._lit_module import overrides
from fitjax.module._weight_room import (
    initial_variables,
    is_unfitted_linen,
    own_variables,
    set_variables,
    take_params_edits,
    weights_to_save,
)

# For the loop and the callbacks, not part of the user-facing API: the dataloader_idx check of the
# Lightning-style hooks, and the flax model host hooks call (installed around them, unwrapped by
# the model summary).
from fitjax.module._host_model import installed as host_model_installed
from fitjax.module._host_model import unwrap as unwrap_host_model
from fitjax.module._lightning import check_dataloader_idx

# For fitjax.models, whose `scan_layers` arrays are stacked where a checkpoint keeps one per
# layer: a source of named arrays (to view as stacked), the arrays a save writes, the writer.
from fitjax.module._weight_sources import Source as WeightSource
from fitjax.module._weight_sources import open_source as open_weight_source
from fitjax.module._weight_sources import save_safetensors
from fitjax.module._weights import export_arrays

__all__ = ["LitModule", "param_groups"]
