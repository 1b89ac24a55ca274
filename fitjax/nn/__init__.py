"""Building blocks for the models users train: fitjax's fused attention (and, beside it, the
output layer's loss). The GPT example and every model in `fitjax.models` call these, so a
platform's faster kernel reaches all of them.
"""

from fitjax.nn._attention import attention, attention_mask
from fitjax.nn._cross_entropy import chunked_cross_entropy

__all__ = ["attention", "attention_mask", "chunked_cross_entropy"]
