"""`TokenBatches`: a language model's batches of a chosen shape, to plan it before its data exists.

A plan reads only the first batch's shapes and dtypes, so the data of a run on a slice need not
be on the planning machine: `fitjax plan --data fitjax.planner.TokenBatches --data.batch_size 16
--data.length 4096` plans a `fitjax.models.CausalLMModule` (or any module that takes
`batch["tokens"]`) at the run's global batch and sequence length.
"""

from __future__ import annotations

import numpy as np

from fitjax.data import DataLoader, DataModule

__all__ = ["TokenBatches"]


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"TokenBatches({name}=...) must be a positive int, got {value!r}.")
    return value


class TokenBatches(DataModule):
    """One batch of token ids, `{"tokens": int32 [batch_size, length + 1]}` (zeros): the inputs
    and, shifted by one, the targets of `length` positions, as `fitjax.models.CausalLMModule`
    takes them.

    Args:
        batch_size: rows a step (the global batch: every device's rows together).
        length: positions each row trains on.

    Example:
        >>> from fitjax.planner import TokenBatches
        >>> data = TokenBatches(batch_size=16, length=4096)
        >>> next(iter(data.train_dataloader()))["tokens"].shape
        (16, 4097)
        >>> # print(fj.plan(CausalLMModule("llama-3.1-8b/config.json"), datamodule=data, target="tpu-v5e-16",
        >>> #               strategy="fsdp", precision="bf16-mixed"))
    """

    def __init__(self, batch_size: int, length: int):
        super().__init__()
        self.batch_size = _positive("batch_size", batch_size)
        self.length = _positive("length", length)

    def train_dataloader(self) -> DataLoader:
        # one batch of host zeros: 4 bytes a token, 262 KiB at 16 x 4096
        tokens = np.zeros((self.batch_size, self.length + 1), np.int32)
        return DataLoader({"tokens": tokens}, batch_size=self.batch_size)
