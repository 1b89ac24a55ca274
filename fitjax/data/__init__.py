"""Data for fitjax: in-memory loaders, adapters for what users bring, batch helpers, DataModule."""

from fitjax.data._adapters import as_loader, as_loaders
from fitjax.data._batching import batch_size_of, pad_batch
from fitjax.data._datamodule import DataModule
from fitjax.data._loader import DataLoader

__all__ = ["DataLoader", "DataModule", "as_loader", "as_loaders", "batch_size_of", "pad_batch"]
