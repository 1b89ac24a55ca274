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


def config_hparams(config: Mapping[str, Any], *, defaults: Mapping[str, Mapping[str, Any]] = ()) -> dict[str, Any]:
    """A CLI config as the hyperparameters a user reads: `model/lr`, not `model/init_args/lr`.

    A `class_path` / `init_args` pair becomes the chosen class under its own key and its
    arguments beside it; `None`s (nothing chosen) are dropped, and so are the values of a section
    equal to that section's `defaults` (Trainer's signature: forty arguments nobody set would bury
    the ones that were). The full config stays in `config.yaml`.

    Example:
        >>> config_hparams({"model": {"class_path": "m.Net", "init_args": {"lr": 0.1}},
        ...                 "ckpt_path": None, "trainer": {"max_epochs": 5, "seed": 0}},
        ...                defaults={"trainer": {"seed": 0}})
        {'model': 'm.Net', 'model/lr': 0.1, 'trainer/max_epochs': 5}
    """
    out: dict[str, Any] = {}
    for key, value in config.items():
        section_defaults = dict(defaults).get(key, {})
        if isinstance(value, Mapping):
            value = {k: v for k, v in value.items() if not (k in section_defaults and v == section_defaults[k])}
        out.update(_lifted(str(key), value))
    return out


def _lifted(key: str, value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, Mapping) and "class_path" in value:
        lifted = {key: value["class_path"]}
        for sub_key, sub_value in (value.get("init_args") or {}).items():
            lifted.update(_lifted(f"{key}/{sub_key}", sub_value))
        return lifted
    if isinstance(value, Mapping):
        return {k: v for sub_key, sub_value in value.items() for k, v in _lifted(f"{key}/{sub_key}", sub_value).items()}
    if isinstance(value, (list, tuple)) and any(isinstance(v, Mapping) for v in value):
        return {k: v for i, item in enumerate(value) for k, v in _lifted(f"{key}/{i}", item).items()}
    return {key: value}
