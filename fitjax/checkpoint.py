"""Checkpoints: plain Orbax directories holding the whole train state and where the loop stood.

One checkpoint is one directory, written by Orbax and finalised atomically (it appears under its
name only once complete; a save killed half-way leaves a `*.orbax-checkpoint-tmp-*` folder that
fitjax ignores):

    checkpoints/epoch=3-step=32/
        state/     the TrainState as a plain dict: step, params, model_state, opt_state,
                   rng (the raw uint32 key data), metrics (train accumulators since the last log)
        meta/      JSON: the loop position (global step, epoch, batches done in it), the train
                   loader's state, callback and logger states, host-side epoch sums, hparams
        metrics/   JSON: the monitored value, when `ModelCheckpoint(monitor=...)` ranks saves

Reading the weights needs `orbax.checkpoint` alone, no fitjax:

    import orbax.checkpoint as ocp
    state = ocp.StandardCheckpointer().restore("checkpoints/epoch=3-step=32/state")
    params = state["params"]            # the nested dict the flax model takes as {"params": ...}
    batch_stats = state["model_state"].get("batch_stats")   # Linen BatchNorm statistics, if any

Most users never call this module: `ModelCheckpoint` saves, `Trainer.fit(ckpt_path=...)` resumes,
`trainer.validate/test/predict(ckpt_path=...)` and `MyModule.load_from_checkpoint(path)` load.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import jax
import numpy as np
from etils import epath

from fitjax._lazy import LazyModule
from fitjax._typing import PyTree
from fitjax.state import TrainState

ocp = LazyModule("orbax.checkpoint")  # imported at the first save or load, not by `import fitjax`

__all__ = ["is_checkpoint", "latest_checkpoint", "load_module", "read_meta", "restore_state",
           "restore_variables", "save_args"]

STATE_ITEM = "state"
META_ITEM = "meta"
_TMP_MARK = ".orbax-checkpoint-tmp"


# ----------------------------------------------------------------------------------- writing

def save_args(state: TrainState, meta: dict[str, Any]) -> ocp.args.Composite:
    """The Orbax arguments that save `state` and the JSON `meta` as one checkpoint."""
    tree, impl = _to_saveable(state)
    return ocp.args.Composite(**{
        STATE_ITEM: ocp.args.StandardSave(tree),
        META_ITEM: ocp.args.JsonSave({**meta, "rng_impl": impl}),
    })


def _to_saveable(state: TrainState) -> tuple[dict[str, Any], str | None]:
    """A plain dict of arrays; a typed PRNG key becomes its uint32 data (Orbax stores arrays)."""
    rng, impl = state.rng, None
    if jax.dtypes.issubdtype(rng.dtype, jax.dtypes.prng_key):
        impl, rng = str(jax.random.key_impl(rng)), jax.random.key_data(rng)
    tree = {"step": state.step, "params": state.params, "model_state": state.model_state,
            "opt_state": state.opt_state, "rng": rng, "metrics": state.metrics}
    return tree, impl


# ----------------------------------------------------------------------------------- finding

def is_checkpoint(path: str | os.PathLike) -> bool:
    """True for a complete (finalised) fitjax checkpoint directory."""
    path = Path(path)
    return _TMP_MARK not in path.name and (path / STATE_ITEM).is_dir() and (path / META_ITEM).is_dir()


def latest_checkpoint(directories: list[str | os.PathLike]) -> Path | None:
    """The complete checkpoint with the highest global step among those in `directories`."""
    best: tuple[int, float, Path] | None = None
    for directory in directories:
        directory = Path(directory)
        if not directory.is_dir():
            continue
        for path in directory.iterdir():
            if is_checkpoint(path):
                key = (read_meta(path)["global_step"], path.stat().st_mtime, path)
                best = key if best is None or key[:2] > best[:2] else best
    return None if best is None else best[2]


def read_meta(path: str | os.PathLike) -> dict[str, Any]:
    """The JSON item of a checkpoint: loop position, component states, hparams."""
    file = Path(path) / META_ITEM / "metadata"
    if not file.is_file():
        raise FileNotFoundError(
            f"{str(path)!r} is not a fitjax checkpoint (no {META_ITEM}/metadata inside). Pass the "
            "folder of one checkpoint, e.g. '.../checkpoints/epoch=3-step=32', or 'last' / 'best'."
        )
    return json.loads(file.read_text())


def check_path(path: str | os.PathLike, *, where: str) -> Path:
    """`path` as a checkpoint folder, or an error saying what was found instead."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{where} takes 'last', 'best' or a checkpoint path; got {path!r}.")
    path = Path(path)
    if is_checkpoint(path):
        return path
    if path.is_dir():  # a folder of checkpoints: its newest complete one
        found = latest_checkpoint([path])
        if found is not None:
            return found
    raise FileNotFoundError(
        f"{where} got {str(path)!r}, which is not a complete fitjax checkpoint nor a folder holding "
        "one. Pass a checkpoint folder (it contains 'state/' and 'meta/'), or 'last' / 'best'."
    )


# --------------------------------------------------------------------------------- restoring

def restore_state(path: str | os.PathLike, like: TrainState) -> TrainState:
    """The saved train state, laid out like `like` (its shapes, dtypes and shardings).

    The target shardings come from `like`, so a state saved under one strategy restores under
    another (8-device data parallel to one device and back). Raises `ValueError` naming the first
    path whose shape differs, or that one side lacks, when the model changed since the save.
    """
    path = Path(path)
    target, impl = _to_saveable(like)
    target = jax.tree.map(_abstract, target)
    _check_tree(_saved_tree(path), target, path)
    tree = ocp.StandardCheckpointer().restore(path / STATE_ITEM, target)
    rng = tree["rng"]
    saved_impl = read_meta(path).get("rng_impl")
    if impl is not None:
        rng = jax.random.wrap_key_data(rng, impl=saved_impl or impl)
    return TrainState(step=tree["step"], params=tree["params"], model_state=tree["model_state"],
                      opt_state=tree["opt_state"], rng=rng, metrics=tree["metrics"])


def restore_variables(path: str | os.PathLike, like: tuple[PyTree, PyTree] | None = None
                      ) -> tuple[PyTree, PyTree]:
    """`(params, model_state)` of a checkpoint, without the optimizer state.

    With `like`, laid out like it (shapes checked, shardings kept); without, restored as saved
    onto the first local device.
    """
    path = Path(path)
    saved = _saved_tree(path)
    if like is None:
        device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        target = jax.tree.map(
            lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device),
            {"params": saved["params"], "model_state": saved["model_state"]},
        )
    else:
        target = jax.tree.map(_abstract, {"params": like[0], "model_state": like[1]})
        _check_tree({k: saved[k] for k in target}, target, path)
    tree = ocp.PyTreeCheckpointer().restore(
        path / STATE_ITEM,
        args=ocp.args.PyTreeRestore(
            item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target),
            partial_restore=True,
        ),
    )
    return tree["params"], tree["model_state"]


def load_module(cls: type, path: str | os.PathLike, **overrides: Any) -> Any:
    """`cls(**saved hparams, **overrides)` holding the checkpoint's weights (no trainer needed)."""
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
    module = cls(**hparams)
    module._set_variables(*restore_variables(path, module._get_binding().initial_variables()))
    return module


def _saved_tree(path: Path) -> PyTree:
    """The saved state's tree of array metadata (shape, dtype), read without loading arrays."""
    metadata = ocp.StandardCheckpointHandler().metadata(epath.Path(path / STATE_ITEM))
    return metadata.tree if hasattr(metadata, "tree") else metadata


def _abstract(x: Any) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None))


def _check_tree(saved: PyTree, target: PyTree, path: Path) -> None:
    """Raises a `ValueError` naming the first leaf that differs in presence or shape."""

    def flat(tree):
        leaves = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: x is None)[0]
        return {_path_str(p): v for p, v in leaves if v is not None}

    first = ("params", "model_state")  # report the weights before the optimizer's copies of them
    rank = lambda name: (first.index(name.split("/")[0]) if name.split("/")[0] in first else 2, name)
    have, want = flat(saved), dict(sorted(flat(target).items(), key=lambda kv: rank(kv[0])))
    fix = ("The module changed since the save: build it as it was (same layers and sizes), or "
           "start a new run without ckpt_path.")
    for name, leaf in want.items():
        if name not in have:
            raise ValueError(f"checkpoint {str(path)!r} does not match the module: it has no "
                             f"'{name}' (the module's is {tuple(leaf.shape)}). {fix}")
        if tuple(have[name].shape) != tuple(leaf.shape):
            raise ValueError(f"checkpoint {str(path)!r} does not match the module at '{name}': "
                             f"saved shape {tuple(have[name].shape)}, module shape "
                             f"{tuple(leaf.shape)}. {fix}")
    extra = sorted((name for name in have if name not in want), key=rank)
    if extra:
        raise ValueError(f"checkpoint {str(path)!r} does not match the module: it has "
                         f"'{extra[0]}', which the module lacks. {fix}")


def _path_str(key_path: tuple) -> str:
    parts = []
    for key in key_path:
        for attr in ("key", "name", "idx"):
            if hasattr(key, attr):
                parts.append(str(getattr(key, attr)))
                break
        else:
            parts.append(str(key))
    return "/".join(parts)


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
