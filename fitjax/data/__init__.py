"""Data for fitjax: in-memory loaders, adapters for what users bring, batch helpers, DataModule."""

from fitjax.data._batching import batch_size_of, pad_batch

__all__ = ["batch_size_of", "pad_batch"]
