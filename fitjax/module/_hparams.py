"""`save_hyperparameters` support: read the caller's `__init__` arguments into an attribute dict."""

from __future__ import annotations

import inspect
from typing import Any, Iterable


class AttributeDict(dict):
    """A dict whose keys read as attributes: `hparams.lr` is `hparams["lr"]`."""

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError:
            raise AttributeError(
                f"hparams has no {key!r}; saved hyperparameters are {sorted(self)}"
            ) from None

    def __setattr__(self, key: str, value: Any) -> None:
        self[key] = value


class RunAttributeDict(AttributeDict):
    """The hyperparameters one run of a `Trainer(runs=[...])` fit reads while it is traced: the
    module's own with the run's values over them; each name read is recorded in `read`."""

    def __init__(self, values: dict, read: set) -> None:
        super().__init__(values)
        object.__setattr__(self, "_read", read)

    def __getitem__(self, key: str) -> Any:
        self._read.add(key)
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self._read.add(key)
        return super().get(key, default)


def collect_init_args(frame: Any, *, names: Iterable[str] = (), ignore: Iterable[str] = ()) -> dict:
    """The arguments of the `__init__` running in `frame` (and of its `**kwargs`), by name."""
    info = inspect.getargvalues(frame)
    args = {name: info.locals[name] for name in info.args if name != "self"}
    if info.varargs and info.locals.get(info.varargs):
        args[info.varargs] = tuple(info.locals[info.varargs])
    if info.keywords:
        args.update(info.locals.get(info.keywords, {}))
    names = list(names)
    if names:
        unknown = [n for n in names if n not in args]
        if unknown:
            raise ValueError(
                f"save_hyperparameters({', '.join(map(repr, names))}): {unknown} are not arguments "
                f"of __init__; the arguments are {sorted(args)}"
            )
        args = {n: args[n] for n in names}
    for name in ignore:
        args.pop(name, None)
    return args
