"""`resolve_loggers`: what `Trainer(logger=...)` accepts, as a list of loggers."""

from __future__ import annotations

import os

from fitjax.loggers._base import Logger
from fitjax.loggers._tensorboard import TensorBoardLogger

_ACCEPTED = (
    "True (a TensorBoardLogger under default_root_dir), False or None (no logging), "
    "a fitjax.loggers.Logger, or a list/tuple of Loggers"
)


def resolve_loggers(
    logger: bool | Logger | list[Logger] | tuple[Logger, ...] | None,
    *,
    default_root_dir: str | os.PathLike[str],
) -> list[Logger]:
    """Turns the `logger` argument of the trainer into the list of loggers to call.

    Args:
        logger: True, False, None, a `Logger`, or a list or tuple of them.
        default_root_dir: Where the default `TensorBoardLogger` writes when `logger` is True.

    Returns:
        The loggers, in the order given.

    Raises:
        TypeError: when `logger` is none of the accepted forms.

    Example:
        >>> [type(x).__name__ for x in resolve_loggers(True, default_root_dir="runs")]
        ['TensorBoardLogger']
        >>> resolve_loggers(None, default_root_dir="runs")
        []
    """
    if logger is True:
        return [TensorBoardLogger(default_root_dir)]
    if logger is False or logger is None:
        return []
    if isinstance(logger, Logger):
        return [logger]
    if isinstance(logger, (list, tuple)):
        for i, item in enumerate(logger):
            if not isinstance(item, Logger):
                raise TypeError(
                    f"`Trainer(logger=...)` got a {type(logger).__name__} whose item {i} is {item!r} "
                    f"({type(item).__name__}), not a Logger. Accepted: {_ACCEPTED}. Wrap custom loggers "
                    f"in a subclass of fitjax.loggers.Logger."
                )
        return list(logger)
    hint = ""
    if isinstance(logger, str):
        hint = " For TensorBoard pass `logger=True`; for a CSV file pass `logger=CSVLogger(save_dir)`."
    raise TypeError(
        f"`Trainer(logger=...)` must be {_ACCEPTED}; got {logger!r} ({type(logger).__name__}).{hint}"
    )
