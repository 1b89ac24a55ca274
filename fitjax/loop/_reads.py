"""The Trainer's read-only attributes that only read one of its parts: declared in one line,
typed by their annotation, documented by the docstring under them (as mkdocstrings reads an
attribute's), each read one Python call, as a property's:
`max_epochs: int | None = config_value()` reads `trainer._config.max_epochs`,
`global_step: int = reads("_progress.global_step")` reads `trainer._progress.global_step`.
"""

from __future__ import annotations

import operator
from typing import Any

__all__ = ["config_value", "reads"]


class _Reads:
    """A data descriptor reading `path` (an attribute path, `{name}` standing for the attribute's
    own name) of the object it is read on; setting it is an error saying what to do instead."""

    def __init__(self, path: str, instead: str) -> None:
        self._path, self._instead = path, instead

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name
        self._get = operator.attrgetter(self._path.format(name=name))

    def __get__(self, trainer: Any, owner: type | None = None) -> Any:
        return self if trainer is None else self._get(trainer)

    def __set__(self, trainer: Any, value: Any) -> None:
        raise AttributeError(f"Trainer.{self._name} is read-only: {self._instead.format(name=self._name)}")


def config_value() -> Any:
    """A Trainer attribute that is its configuration's field of the same name (`LoopConfig`)."""
    return _Reads("_config.{name}", "it is a `Trainer({name}=...)` argument, fixed when the Trainer is made; "
                                    "make another Trainer to change it.")


def reads(path: str) -> Any:
    """A Trainer attribute that reads `path` of it (`"_progress.global_step"`): what the loop
    sets, for the callbacks and the user to read."""
    return _Reads(path, "the loop sets it; callbacks and users read it.")
