"""The checkpoint format: what a checkpoint folder holds, how it is saved, found, checked and
restored (the layout is described in `fitjax.checkpoint`)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any, Iterator

import jax
import numpy as np
from etils import epath

from fitjax import _safe_names, _storage
from fitjax._lazy import LazyModule
from fitjax._typing import PyTree
from fitjax.checkpoint import _trainable
from fitjax.checkpoint._tree_check import LOAD_WEIGHTS, check_tree, path_str
from fitjax.state import TrainState

ocp = LazyModule("orbax.checkpoint")  # imported at the first save or load, not by `import fitjax`

__all__ = ["CheckpointDamaged", "SaveFailed", "checkpoints_newest_first", "composite_args", "damage",
           "incomplete_checkpoints", "is_checkpoint", "latest_checkpoint", "local_path", "module_init_args",
           "read_meta", "restore_state", "restore_variables", "save_args", "saveable_tree", "verify"]

STATE_ITEM = "state"
META_ITEM = "meta"
TMP_MARK = ".orbax-checkpoint-tmp"


# ----------------------------------------------------------------------------------- writing

def save_args(state: TrainState, meta: dict[str, Any], *, to_host: bool = False) -> ocp.args.Composite:
    """The Orbax arguments that save `state` and the JSON `meta` as one checkpoint.

    Every `TrainState` field that is not None is saved under its own name, whatever it holds, so
    a field added to the state is checkpointed without code here. `meta` may carry `"options"`
    (e.g. `{"precision": "16-mixed"}`): restore errors quote them. `to_host`: the arrays are
    copied to host memory now (one `device_get`), for a save written after the state's buffers
    are donated to the next step.
    """
    tree, impls = saveable_tree(state)
    return composite_args(jax.device_get(tree) if to_host else tree, impls, meta)


def composite_args(tree: dict[str, Any], impls: dict[str, str], meta: dict[str, Any]) -> ocp.args.Composite:
    """The Orbax arguments of one checkpoint from `saveable_tree`'s result and the JSON `meta`."""
    return ocp.args.Composite(**{
        STATE_ITEM: ocp.args.StandardSave(tree),
        META_ITEM: ocp.args.JsonSave({**meta, "key_impls": impls}),
    })


def saveable_tree(state: TrainState) -> tuple[dict[str, Any], dict[str, str]]:
    """The state's non-None fields as a dict; typed PRNG keys become their uint32 data (Orbax
    stores plain arrays), their implementations returned by path to wrap them back on restore."""
    impls: dict[str, str] = {}

    def plain(key_path, leaf):
        if isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            impls[path_str(key_path)] = str(jax.random.key_impl(leaf))
            return jax.random.key_data(leaf)
        return leaf

    fields = {f.name: getattr(state, f.name) for f in dataclasses.fields(state)}
    tree = {name: value for name, value in fields.items() if value is not None}
    return jax.tree_util.tree_map_with_path(plain, tree), impls


# ----------------------------------------------------------------------------------- finding

def local_path(path: str | os.PathLike) -> _storage.AnyPath:
    """`path` with `~` expanded, made absolute against the working directory (Orbax takes
    absolute paths only); an object-store URL (`s3://...`, `gs://...`) as an `epath.Path`."""
    return _storage.as_path(path)


class CheckpointDamaged(ValueError):
    """A checkpoint folder whose files are missing or unreadable; the message names the damage."""


class SaveFailed(RuntimeError):
    """A checkpoint save that failed (raised during fit, at the step after the failure)."""


def damage(path: str | os.PathLike) -> str | None:
    """What makes `path` not a complete checkpoint (cheap: file checks only), or None. On a
    store, its requests are retried as a save's are (`_storage.retried`)."""
    path = local_path(path)
    if _storage.is_url(path):
        return _storage.retried("checking a checkpoint", str(path), lambda: _damage(path))
    return _damage(path)


def folder_entries(directory: _storage.AnyPath) -> list[_storage.AnyPath]:
    """What `directory` holds (none when it is not there); on a store one retried listing."""
    if _storage.is_url(directory):
        return [directory / name for name in _storage.names(directory)]
    return list(directory.iterdir()) if directory.is_dir() else []


def _damage(path: _storage.AnyPath) -> str | None:
    if TMP_MARK in path.name:
        return "it is the leftover of an interrupted save or deletion"
    if not path.is_dir():
        return "no such folder"
    if _storage.is_url(path) and not (path / _storage.COMPLETE).exists():
        return f"{_storage.COMPLETE} is missing (an incomplete upload)"
    for item, file in ((META_ITEM, "metadata"), (STATE_ITEM, "_METADATA")):
        if not (path / item / file).is_file():
            return f"{item}/{file} is missing"
    try:
        meta = json.loads((path / META_ITEM / "metadata").read_text())
    except (OSError, ValueError) as error:
        return f"{META_ITEM}/metadata is unreadable ({_first_line(error)})"
    if not isinstance(meta, dict) or "global_step" not in meta:
        return f"{META_ITEM}/metadata holds no loop position"
    return None


def is_checkpoint(path: str | os.PathLike) -> bool:
    """True for a complete (finalised) fitjax checkpoint directory."""
    return damage(path) is None


def checkpoints_newest_first(directories: list[str | os.PathLike]) -> list[Path]:
    """The complete checkpoints in `directories`, the most recently saved first (by the time
    recorded in each, else its files' time): a reused folder's newest run comes first, whatever
    its step count."""
    found = []
    for directory in directories:
        found += [path for path in folder_entries(local_path(directory)) if is_checkpoint(path)]

    def saved_at(path: Path) -> tuple[float, int]:
        meta = read_meta(path)
        when = meta.get("saved_at") or (path / META_ITEM / "metadata").stat().st_mtime
        return float(when), int(meta["global_step"])

    return sorted(found, key=saved_at, reverse=True)


def incomplete_checkpoints(directories: list[str | os.PathLike]) -> list[tuple[Path, str, float]]:
    """The folders in `directories` that hold part of a checkpoint (`state/` or `meta/`) but are
    not complete, and not an interrupted save's leftover (on disk Orbax's temporary folder, on a
    store a prefix whose upload fitjax began and never finished, `_storage.is_partial`: neither
    is ever chosen, and the next start removes it): `(path, damage, modified time)`."""
    found = []
    for directory in directories:
        for path in folder_entries(local_path(directory)):
            try:
                entry = (_storage.retried("checking a checkpoint", str(path), lambda: _incomplete(path))
                         if _storage.is_url(path) else _incomplete(path))
            except FileNotFoundError:  # removed since it was listed: another process's cleanup
                continue  # or a top-k deletion (a store's listing can lag behind a delete)
            if entry is not None:
                found.append(entry)
    return found


def _incomplete(path: _storage.AnyPath) -> tuple[Path, str, float] | None:
    if (TMP_MARK in path.name or not path.is_dir() or (problem := _damage(path)) is None
            or not ((path / STATE_ITEM).is_dir() or (path / META_ITEM).is_dir())
            or (_storage.is_url(path) and _storage.is_partial(path))):
        return None
    files = [f for f in (path / STATE_ITEM / "_METADATA", path / META_ITEM / "metadata")
             if f.is_file()]  # written by the save: when it ran
    return path, problem, max(_mtime(f) for f in files or [path])


def _mtime(path: _storage.AnyPath) -> float:
    """When `path` was last modified (`os.stat_result.st_mtime`; a store's `epath` stat: `mtime`)."""
    stat = path.stat()
    return float(getattr(stat, "st_mtime", None) or getattr(stat, "mtime", 0.0) or 0.0)


def latest_checkpoint(directories: list[str | os.PathLike]) -> Path | None:
    """The most recently saved complete checkpoint in `directories`, or None."""
    found = checkpoints_newest_first(directories)
    return found[0] if found else None


# Checkpoints whose arrays `verify` reads back in full; a larger one is checked from its metadata.
VERIFY_BYTES = 256 * 2**20


def verify(path: str | os.PathLike) -> None:
    """Raises `CheckpointDamaged` naming the damage if `path` cannot be restored: its files
    checked, its state read back (when under `VERIFY_BYTES`; else only its array metadata)."""
    shown, path = local_path(path), _readable(path)
    tree = _saved_tree(path, shown)
    size = sum(math.prod(leaf.shape) * np.dtype(leaf.dtype).itemsize
               for leaf in jax.tree.leaves(tree) if hasattr(leaf, "shape"))
    if size <= VERIFY_BYTES:
        device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device), tree)
        with _reading(path, shown):
            jax.block_until_ready(_restore(path, target))


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return (lines[0][:200] + ("..." if len(lines[0]) > 200 else "")) if lines else type(error).__name__


def read_meta(path: str | os.PathLike) -> dict[str, Any]:
    """The JSON item of a checkpoint: loop position, component states, hparams."""
    file = local_path(path) / META_ITEM / "metadata"
    if not file.is_file():
        raise FileNotFoundError(
            f"{str(path)!r} is not a fitjax checkpoint (no {META_ITEM}/metadata inside). Pass the "
            "folder of one checkpoint, e.g. '.../checkpoints/epoch=3-step=32', or 'last' / 'best'."
        )
    try:
        if _storage.is_url(file):
            return json.loads(_storage.retried("reading", str(file), file.read_text))
        return json.loads(file.read_text())
    except ValueError as error:
        raise CheckpointDamaged(f"checkpoint {str(path)!r} is damaged: {META_ITEM}/metadata is "
                                f"unreadable ({_first_line(error)}).") from None


def check_path(path: str | os.PathLike, *, where: str) -> Path:
    """`path` as a checkpoint folder, or an error saying what was found instead."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{where} takes 'last', 'best' or a checkpoint path; got {path!r}.")
    given, path = path, local_path(path)
    if is_checkpoint(path):
        return path
    if path.is_dir():  # a folder of checkpoints: its newest complete one
        found = latest_checkpoint([path])
        if found is not None:
            return found
    raise FileNotFoundError(
        f"{where} got {os.fspath(given)!r} ({str(path)!r}), which is not a complete fitjax checkpoint nor a folder holding "
        "one. Pass a checkpoint folder (it contains 'state/' and 'meta/'), or 'last' / 'best'."
    )


# --------------------------------------------------------------------------------- restoring

def restore_state(path: str | os.PathLike, like: TrainState, *,
                  options: dict[str, Any] | None = None, trains: PyTree | None = None) -> TrainState:
    """The saved train state, laid out like `like` (its shapes, dtypes and shardings).

    The target shardings come from `like`, so a state saved under one strategy restores under
    another (8-device data parallel to one device and back). Every field of `like` that is not
    None is restored; a field the checkpoint has and `like` lacks, or the reverse, or a leaf
    whose shape differs, raises a `ValueError` naming the field and what changed: the module
    (`params`, `model_state`), the optimizer (`opt_state`), or the option that creates the
    field (`loss_scale`: `precision`). `options` are this run's (e.g. `{"precision": "32-true"}`),
    quoted in those errors next to the ones saved in the checkpoint.

    A checkpoint of the trained parameters alone (`ModelCheckpoint(weights="trainable")`)
    takes the frozen ones from `like`, after checking they are those it was trained against;
    `trains` is this run's trainable mask (`LitModule.trainable_mask`; True: trains).
    """
    shown, path = local_path(path), _readable(path)
    meta = read_meta(path)
    full = like
    if meta.get(_trainable.FROZEN_KEY) is not None:  # the frozen base is this run's, if it is the same
        _trainable.check_frozen(meta[_trainable.FROZEN_KEY], like.params, trains, f"checkpoint {str(shown)!r}")
        like = _trainable.keep_trained(like, trains)
    target, impls = saveable_tree(like)
    target = jax.tree.map(_abstract, target)
    check_tree(_saved_tree(path, shown), target, shown, saved_options=meta.get("options", {}),
                options=options or {})
    saved, ours = meta.get("options", {}).get("precision"), (options or {}).get("precision")
    if saved is not None and ours is not None and saved != ours:
        raise ValueError(f"checkpoint {str(shown)!r} was saved with precision={saved!r}, and this run "
                         f"uses precision={ours!r}. Resume with precision={saved!r}, {LOAD_WEIGHTS}")
    with _reading(path, shown):
        tree = _restore(path, target)
    saved_impls = meta.get("key_impls", {"rng": meta["rng_impl"]} if meta.get("rng_impl") else {})

    def typed(key_path, leaf):
        name = path_str(key_path)
        return leaf if name not in impls else jax.random.wrap_key_data(
            leaf, impl=saved_impls.get(name, impls[name]))

    tree = jax.tree_util.tree_map_with_path(typed, tree)
    if full is not like:
        tree["params"] = _trainable.merge_trained(full.params, tree["params"])
    return dataclasses.replace(full, **{f.name: tree.get(f.name) for f in dataclasses.fields(full)})


def restore_variables(path: str | os.PathLike, like: tuple[PyTree, PyTree] | None = None
                      ) -> tuple[PyTree, PyTree]:
    """`(params, model_state)` of a checkpoint, without the optimizer state.

    The parameters are the ones validation used when the checkpoint was saved: an `EMA`'s
    average when it was saved with `fj.EMA(use_for_eval=True)` (the checkpoint's meta names
    where, `eval_params`), as Lightning's `WeightAveraging` saves the average as the weights.
    With `like`, laid out like it (shapes checked, shardings kept, the average cast to the
    parameters' dtypes); without, restored as saved onto the first local device.
    """
    shown, path = local_path(path), _readable(path)
    saved = _saved_tree(path, shown)
    meta = read_meta(path)
    if meta.get(_trainable.FROZEN_KEY) is not None:
        raise ValueError(f"checkpoint {str(shown)!r} holds only the trained parameters "
                         "(ModelCheckpoint(weights='trainable')), not the frozen base: it resumes a fit "
                         "(`Trainer.fit(module, ckpt_path=...)`, the module given the same base weights), and "
                         "`module.save_weights(path, lora='adapters')` after that fit writes the adapters for "
                         "`load_adapters`. To load weights from a checkpoint, save with weights='all'.")
    key = meta.get("eval_params") or ["params"]
    saved_params = _at(saved, key)
    if like is None:
        device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device),
                              {"params": saved_params, "model_state": saved["model_state"]})
    else:
        target = jax.tree.map(_abstract, {"params": like[0], "model_state": like[1]})
        check_tree({"params": saved_params, "model_state": saved["model_state"]}, target, shown,
                    saved_options={}, options={})
        # the average is read in its own dtype (float32 for bf16 parameters), cast below
        target["params"] = jax.tree.map(lambda t, m: jax.ShapeDtypeStruct(t.shape, m.dtype, sharding=t.sharding),
                                        target["params"], saved_params)
    # the params at their place in the saved tree: a partial restore reads them alone
    read = {"model_state": target["model_state"], **_nested(key, target["params"])}
    with _reading(path, shown):
        tree = ocp.PyTreeCheckpointer().restore(
            path / STATE_ITEM,
            args=ocp.args.PyTreeRestore(item=read, restore_args=ocp.checkpoint_utils.construct_restore_args(read),
                                        partial_restore=True),
        )
    params = _at(tree, key)
    if like is not None:
        params = jax.tree.map(lambda p, t: p if p.dtype == t.dtype else p.astype(t.dtype), params, like[0])
    return params, tree["model_state"]


def _at(tree: PyTree, key: list[str]) -> PyTree:
    """`tree[key[0]][key[1]]...`."""
    for name in key:
        tree = tree[name]
    return tree


def _nested(key: list[str], value: PyTree) -> dict[str, Any]:
    """`{key[0]: {key[1]: ... value}}`."""
    for name in reversed(key):
        value = {name: value}
    return value


def module_init_args(cls: type, path: str | os.PathLike, overrides: dict[str, Any]
                     ) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """`(path, kwargs, meta)` for `cls.load_from_checkpoint(path, **overrides)`: the checked path,
    the saved hparams updated by `overrides` (`cls(**kwargs)` rebuilds the module), and the
    checkpoint's plain-data item."""
    path = check_path(path, where=f"{cls.__name__}.load_from_checkpoint(path)")
    meta = read_meta(path)
    hparams = {**meta.get("hparams", {}), **overrides}
    missing = [name for name in meta.get("hparams_not_saved", []) if name not in overrides]
    if missing:
        raise ValueError(
            f"{cls.__name__}.load_from_checkpoint: the hyperparameters {missing} were not JSON "
            f"values and were not saved; pass them again, e.g. "
            f"`{cls.__name__}.load_from_checkpoint(path, {missing[0]}=...)`."
        )
    return path, hparams, meta


def _readable(path: str | os.PathLike) -> Path:
    """A local folder holding checkpoint `path`: itself, or for a store URL its downloaded copy
    (after the same checks as a local one, naming the URL)."""
    path = local_path(path)
    if not _storage.is_url(path):
        return path
    problem = damage(path)
    if problem is not None:
        raise CheckpointDamaged(f"checkpoint {str(path)!r} is damaged: {problem}.")
    try:
        return _storage.download(path)
    except FileNotFoundError as error:  # a file its list names is gone, or of another size
        raise CheckpointDamaged(f"checkpoint {str(path)!r} is damaged: {_first_line(error)}.") from None
    except _safe_names.UnsafeName as error:  # its record names a place outside it: nothing written
        raise CheckpointDamaged(f"checkpoint {str(path)!r} is damaged: {error}.") from None


def _restore(path: Path, target: PyTree) -> PyTree:
    """The state item restored like `target`, with Orbax's synchronous checkpointer (its async
    one leaves callbacks on a closed event loop when a damaged file makes the read fail)."""
    with ocp.Checkpointer(ocp.StandardCheckpointHandler()) as reader:
        return reader.restore(path / STATE_ITEM, args=ocp.args.StandardRestore(target))


@contextlib.contextmanager
def _reading(path: Path, shown: _storage.AnyPath | None = None) -> Iterator[None]:
    """Orbax's and TensorStore's read errors (several KB each) as one short line naming `shown`
    (the URL of a store checkpoint whose local copy `path` is), else `path`."""
    shown = path if shown is None else shown
    problem = damage(path)
    if problem is not None:
        raise CheckpointDamaged(f"checkpoint {str(shown)!r} is damaged: {problem}.")
    try:
        yield
    except Exception as error:  # noqa: BLE001 - Orbax and TensorStore raise many kinds
        raise CheckpointDamaged(f"checkpoint {str(shown)!r} is damaged: {STATE_ITEM}/ cannot be "
                                f"read ({_first_line(error)}).") from None


def _saved_tree(path: Path, shown: _storage.AnyPath | None = None) -> PyTree:
    """The saved state's tree of array metadata (shape, dtype), read without loading arrays."""
    with _reading(path, shown):
        metadata = ocp.StandardCheckpointHandler().metadata(epath.Path(path / STATE_ITEM))
    return metadata.tree if hasattr(metadata, "tree") else metadata


def _abstract(x: Any) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None))


def jsonable(values: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The JSON-serialisable items of `values`, and the names of the others."""
    kept, dropped = {}, []
    for name, value in values.items():
        if isinstance(value, np.generic):
            value = value.item()
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            dropped.append(name)
        else:
            kept[name] = value
    return kept, dropped
