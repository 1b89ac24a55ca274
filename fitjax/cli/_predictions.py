"""`fitjax predict --output FILE`: where predictions go, and the line that says so.

`Trainer.predict` returns host arrays (or a pytree of them) in input order, one row per example;
the CLI writes them as `.npy` (one array), `.npz` (a pytree, one array per leaf, named by its
path) or `.csv` (one array of at most two dimensions, or a flat dict of one-column arrays).
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import jax
import numpy as np

__all__ = ["add_output_argument", "check_output", "report", "write"]

SUFFIXES = (".npy", ".npz", ".csv")


def add_output_argument(parser: Any) -> None:
    """Adds `--output` to the `predict` subcommand's parser."""
    parser.add_argument("--output", type=str | None, default=None,
                        help="Write the predictions to this file: .npy (one array), .npz (a dict/pytree of "
                             "arrays) or .csv (rows of an array of at most 2 dimensions).")


def check_output(output: str) -> Path:
    """`output` as a path that can be written, or a ValueError saying what is accepted."""
    path = Path(output)
    if path.suffix not in SUFFIXES:
        raise ValueError(f"--output={output!r}: the file must end in one of {list(SUFFIXES)} "
                         "(.npy for one array, .npz for several, .csv for a table).")
    if not path.parent.is_dir():
        raise ValueError(f"--output={output!r}: the folder {str(path.parent)!r} does not exist; create it first.")
    return path


def _leaves(predictions: Any) -> dict[str, np.ndarray]:
    flat = jax.tree_util.tree_flatten_with_path(predictions)[0]
    return {jax.tree_util.keystr(key, simple=True, separator="/") or "predictions": np.asarray(leaf)
            for key, leaf in flat}


class _DoesNotFit(ValueError):
    """The predictions' structure does not fit the format asked for (they are written as .npz)."""


def write(predictions: Any, output: str) -> tuple[Path, str]:
    """Writes `predictions` to `output` in the format its suffix names; returns the path written
    and a note. Predictions that do not fit that format go to the same name ending in `.npz`
    instead (the note says why): a prediction run is never lost to the choice of a suffix."""
    path = check_output(output)
    leaves = _leaves(predictions)
    try:
        if path.suffix == ".npy":
            if len(leaves) != 1:
                raise _DoesNotFit(f"they are {len(leaves)} arrays ({list(leaves)}) and a .npy file holds one")
            np.save(path, next(iter(leaves.values())))
        elif path.suffix == ".csv":
            _write_csv(path, leaves)
        else:
            np.savez(path, **leaves)
    except _DoesNotFit as why:
        path = path.with_suffix(".npz")
        np.savez(path, **leaves)
        return path, f" (not {output!r}: {why})"
    return path, ""


def _write_csv(path: Path, leaves: dict[str, np.ndarray]) -> None:
    if len(leaves) == 1:
        (name, array), = leaves.items()
        if array.ndim > 2:
            raise _DoesNotFit(f"rows of shape {array.shape[1:]} do not fit a table")
        table = array.reshape(len(array), -1)
        header = [name] if table.shape[1] == 1 else [f"{name}/{i}" for i in range(table.shape[1])]
    else:
        if any(a.ndim > 2 or (a.ndim == 2 and a.shape[1] != 1) for a in leaves.values()):
            shapes = {k: a.shape for k, a in leaves.items()}
            raise _DoesNotFit(f"a table holds one column per array and these are {shapes}")
        header, table = list(leaves), np.stack([a.reshape(len(a)) for a in leaves.values()], axis=1)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(table.tolist())


def report(predictions: Any, output: str | None) -> str:
    """Writes the predictions when `output` is given; the line the CLI prints about them."""
    if predictions is None:
        return "predict: the data gave no batches; nothing was predicted."
    leaves = _leaves(predictions)
    rows = len(next(iter(leaves.values())))
    shapes = ", ".join(f"{k} {a.dtype}{list(a.shape[1:])}" for k, a in leaves.items())
    if output is None:
        return (f"predict: {rows} rows ({shapes}), not saved: pass --output FILE (.npy, .npz or .csv) "
                "to write them.")
    path, note = write(predictions, output)
    return f"predict: wrote {rows} rows ({shapes}) to {path}{note}"
