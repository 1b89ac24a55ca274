"""Where a warning points: the user's line, however deep inside fitjax it is raised."""

from __future__ import annotations

import os
import sys

__all__ = ["user_stacklevel"]

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def user_stacklevel() -> int:
    """The `stacklevel` that makes a `warnings.warn` called by the caller of this function name
    the first frame outside the fitjax package (the user's `fit` call, say), whatever path of
    fitjax's own calls led there.

    Example:
        >>> import warnings
        >>> warnings.warn("a note", stacklevel=user_stacklevel())  # doctest: +SKIP
    """
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    return level
