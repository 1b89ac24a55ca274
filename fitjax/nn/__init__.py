"""Building blocks for the models users train: fitjax's fused attention (and, beside it, the
output layer's loss). Every model in `fitjax.models` calls both (its attention through
`attention`, its training loss through `chunked_cross_entropy`), and the GPT example is one of
those models, so a platform's faster kernel reaches all of them.
"""

from fitjax.nn._attention import attention, attention_mask
from fitjax.nn._cross_entropy import chunked_cross_entropy

__all__ = ["attention", "attention_mask", "chunked_cross_entropy"]
