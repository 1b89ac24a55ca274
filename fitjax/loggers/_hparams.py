"""Hyperparameters as the loggers store them: `hparams.yaml`, and flat scalars for TensorBoard."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

Scalar = bool | int | float | str


def check_params(owner: str, params: object) -> Mapping[str, Any]:
    """Returns `params` when it is a mapping; raises naming the method otherwise."""
    if not isinstance(params, Mapping):
        raise TypeError(
            f"`{owner}.log_hyperparams(params)` must be a mapping (a dict, possibly nested); got "
            f"{params!r} ({type(params).__name__}). Pass `dict(...)` or `vars(namespace)`."
        )
    return params


def to_plain(value: Any) -> Any:
    """`value` as YAML-safe data: mappings and sequences kept, scalars unwrapped, the rest strings.

    Example:
        >>> to_plain({"sizes": (64, 64), "act": print, "lr": 0.1})
        {'sizes': [64, 64], 'act': '<built-in function print>', 'lr': 0.1}
    """
    if isinstance(value, Mapping):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    return _scalar(value, none=None)


def flatten(params: Mapping[str, Any], *, sep: str = "/") -> dict[str, Scalar]:
    """Nested mappings joined into `a/b` keys, every value a bool, number or string.

    Example:
        >>> flatten({"optim": {"lr": 0.1, "betas": (0.9, 0.99)}, "seed": None})
        {'optim/lr': 0.1, 'optim/betas': '(0.9, 0.99)', 'seed': 'None'}
    """
    flat: dict[str, Scalar] = {}
    for key, value in params.items():
        if isinstance(value, Mapping) and value:
            for sub_key, sub_value in flatten(value, sep=sep).items():
                flat[f"{key}{sep}{sub_key}"] = sub_value
        else:
            flat[str(key)] = _scalar(value, none="None")
    return flat


def write_yaml(path: Path, params: Mapping[str, Any]) -> None:
    """Writes `params` to `path` as YAML readable by `yaml.safe_load`."""
    path.write_text(yaml.safe_dump(to_plain(params), sort_keys=False))


def _scalar(value: Any, *, none: Any) -> Any:
    if value is None:
        return none
    if isinstance(value, (bool, int, float, str)):
        return value
    # numpy / jax scalars and 0-d arrays: the value, not "Array(0.1, dtype=float32)".
    if getattr(value, "shape", None) == () and hasattr(value, "item"):
        item = value.item()
        if isinstance(item, (bool, int, float, str)):
            return item
    return str(value)
