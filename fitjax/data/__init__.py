"""Data for fitjax: in-memory loaders, token batches from text files, adapters for what users
bring, batch helpers, DataModule."""

from fitjax.data._adapters import as_loader, as_loaders
from fitjax.data._batching import batch_size_of, pad_batch
from fitjax.data._datamodule import DataModule
from fitjax.data._loader import DataLoader
from fitjax.data._text import TextLoader, packing_efficiency

# For the loop, not part of the user-facing API: the checks of what fit receives and of each batch,
# the loaders of a `val_data` argument, and the train data kept on the devices.
from fitjax.data._adapters import each_loader, unshuffled
from fitjax.data._checks import check_fit_data, checked_batches
from fitjax.data._device_blocks import Feed, feed_for

__all__ = ["DataLoader", "DataModule", "TextLoader", "as_loader", "as_loaders", "batch_size_of", "packing_efficiency",
           "pad_batch"]
