"""Where outside weights come from: a source names its arrays (shape, dtype) and places the ones
asked for into given shardings, reading no more of each than the devices of this process hold.

Sources: a safetensors file (read through a memory map of the file, so a slice touches only its
own bytes: an fsdp shard reads its rows, not the tensor), a Hugging Face model folder (its
`*.safetensors`, sharded ones through `model.safetensors.index.json`), a plain Orbax tree or a
fitjax checkpoint (Orbax reads each array's shards into their shardings), a `.msgpack` file of
flax's serialization, or a mapping of arrays in memory (numpy, jax or torch tensors: a
`state_dict()`).
"""

from __future__ import annotations

import abc
import json
import math
import os
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import jax
import ml_dtypes
import numpy as np

__all__ = ["Placement", "Source", "open_source"]


class Placement(NamedTuple):
    """One array to place: the source's `name`, the target's shape, dtype and sharding, and the
    axis order `perm` taking the source's layout to the target's (None: the same layout)."""

    name: str
    target: jax.ShapeDtypeStruct  # with .sharding
    perm: tuple[int, ...] | None


class Source(abc.ABC):
    """Named arrays outside fitjax."""

    #: what the source is, for errors ("safetensors file 'model.safetensors'")
    description: str

    @abc.abstractmethod
    def entries(self) -> dict[str, jax.ShapeDtypeStruct]:
        """Every array's name, shape and dtype, read without reading the arrays."""

    @abc.abstractmethod
    def read(self, name: str, index: tuple[slice, ...]) -> np.ndarray:
        """The part `index` of array `name` (in the source's layout)."""

    def place(self, placements: list[Placement]) -> list[jax.Array]:
        """The arrays, each in its target's sharding: every local device's part read alone
        (a replicated array is read once per process, not once per device)."""
        return [_from_slices(self, p) for p in placements]


def _from_slices(source: Source, placement: Placement) -> jax.Array:
    name, target, perm = placement
    parts: dict[tuple, np.ndarray] = {}

    def part(index: tuple[slice, ...]) -> np.ndarray:
        key = tuple((s.start, s.stop, s.step) for s in index)
        if key not in parts:
            if perm is None:
                parts[key] = np.asarray(source.read(name, index), dtype=target.dtype)
            else:  # target axis k is the source's axis perm[k]
                src_index = [slice(None)] * len(perm)
                for k, axis in enumerate(perm):
                    src_index[axis] = index[k]
                parts[key] = np.asarray(source.read(name, tuple(src_index)).transpose(perm), dtype=target.dtype)
        return parts[key]

    return jax.make_array_from_callback(target.shape, target.sharding, part)


# ------------------------------------------------------------------------------- safetensors

_SAFETENSORS_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
    "F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8,
    "U64": np.uint64, "U32": np.uint32, "U16": np.uint16, "U8": np.uint8, "BOOL": np.bool_,
}


class SafetensorsFiles(Source):
    """One or several `.safetensors` files (a sharded Hugging Face checkpoint), memory-mapped:
    the format is an 8-byte header length, a JSON header (name -> dtype, shape, byte offsets) and
    the raw little-endian bytes, so a slice of a memory map reads only the pages it touches."""

    def __init__(self, files: list[Path], description: str):
        self.description = description
        self._where: dict[str, tuple[Path, int, dict]] = {}  # name -> (file, data start, header entry)
        for file in files:
            start, header = read_header(file)
            for name, entry in header.items():
                self._where[name] = (file, start, entry)
        self._maps: dict[Path, np.memmap] = {}

    def entries(self):
        return {name: jax.ShapeDtypeStruct(tuple(e["shape"]), _dtype(e["dtype"], name, self.description))
                for name, (_, _, e) in self._where.items()}

    def read(self, name, index):
        file, start, entry = self._where[name]
        if file not in self._maps:
            self._maps[file] = np.memmap(file, dtype=np.uint8, mode="r")
        begin, end = entry["data_offsets"]
        raw = self._maps[file][start + begin: start + end]
        array = raw.view(_dtype(entry["dtype"], name, self.description)).reshape(entry["shape"])
        return np.array(array[index])  # a copy of just the slice, out of the map


MAX_HEADER = 100 * 2**20  # bytes: the safetensors library refuses larger headers too
_LFS_POINTER = b"version https://git-lfs.github.com/spec/"


def read_header(file: Path) -> tuple[int, dict[str, dict]]:
    """`(where the data starts, {name: header entry})` of the safetensors file `file`, every
    entry checked against the file before any array is read or allocated: a known dtype, a
    shape of non-negative ints whose bytes are its offsets' span, offsets inside the data
    section, no two tensors sharing bytes. A cut download, an empty file, a git-lfs pointer or a
    crafted header is an error naming the file (and the tensor), never a `MemoryError` or a
    reshape deep inside numpy."""
    where = f"safetensors file {str(file)!r}"
    try:
        size = file.stat().st_size
        with open(file, "rb") as f:
            head = f.read(8)
            if head + f.read(len(_LFS_POINTER) - 8) == _LFS_POINTER:
                raise ValueError(
                    f"{where} is a git-lfs pointer ({size} bytes), not the weights: the folder was cloned "
                    "without git-lfs fetching its large files. Run `git lfs pull` in the folder, or download it "
                    "with `huggingface-cli download NAME --local-dir DIR`.")
            if size < 8:
                what = "is empty (0 bytes)" if size == 0 else f"holds {size} bytes, fewer than its 8-byte header length"
                raise ValueError(f"{where} {what}: a download or copy that did not finish? Download it again.")
            (length,) = struct.unpack("<Q", head)
            if length > size - 8:
                raise ValueError(f"{where}: its first 8 bytes give a header of {length} bytes, but the file holds "
                                 f"{size} bytes in all: not a safetensors file, or a cut one. Download it again.")
            if length > MAX_HEADER:
                raise ValueError(f"{where}: its first 8 bytes give a header of {length} bytes, above the "
                                 f"{MAX_HEADER} safetensors allows: not a safetensors file, or a damaged one.")
            f.seek(8)
            text = f.read(length)
    except OSError as error:
        raise ValueError(f"{where} cannot be read: {error}.") from None
    try:
        header = json.loads(text)
    except (ValueError, UnicodeDecodeError) as error:
        raise ValueError(f"{where}: its header is not JSON ({error}): not a safetensors file, or a damaged "
                         "one. Download it again.") from None
    if not isinstance(header, dict):
        raise ValueError(f"{where}: its header is {type(header).__name__}, not a JSON object: not a "
                         "safetensors file.")
    data = size - 8 - length
    entries = {name: _checked_entry(entry, name, where, data) for name, entry in header.items()
               if name != "__metadata__"}
    reach, last = 0, ""  # the furthest end so far, and whose it is
    for begin, end, name in sorted((*e["data_offsets"], name) for name, e in entries.items()):
        if begin == end:
            continue  # an empty tensor shares no byte with anything
        if begin < reach:
            raise ValueError(f"{where}: tensors {last!r} and {name!r} overlap (bytes {begin}..{min(end, reach)} "
                             "of the data are in both): a damaged or crafted file. Download it again.")
        reach, last = end, name
    return 8 + length, entries


def _checked_entry(entry: Any, name: str, where: str, data: int) -> dict:
    if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= set(entry):
        raise ValueError(f"{where}: the header entry of tensor {name!r} is {entry!r}; a safetensors entry "
                         "holds 'dtype', 'shape' and 'data_offsets'.")
    dtype = _dtype(entry["dtype"], name, where) if isinstance(entry["dtype"], str) else None
    shape, offsets = entry["shape"], entry["data_offsets"]
    if dtype is None or not _ints(shape) or not _ints(offsets) or len(offsets) != 2:
        raise ValueError(f"{where}: tensor {name!r} has dtype={entry['dtype']!r}, shape={shape!r}, "
                         f"data_offsets={offsets!r}; a safetensors entry has a dtype name, a list of sizes "
                         "and [begin, end] byte offsets, all non-negative ints.")
    begin, end = offsets
    if not begin <= end <= data:
        raise ValueError(f"{where}: tensor {name!r} lies at bytes {begin}..{end} of a data section of {data} "
                         "bytes: the file is cut (a download that did not finish?) or damaged. Download it again.")
    needed = math.prod(shape) * dtype.itemsize
    if end - begin != needed:
        raise ValueError(f"{where}: tensor {name!r} of shape {tuple(shape)} and dtype {entry['dtype']} needs "
                         f"{needed} bytes, but its offsets {begin}..{end} span {end - begin}: a damaged or "
                         "crafted file. Download it again.")
    return entry


def _ints(values: Any) -> bool:
    return isinstance(values, list) and all(type(v) is int and v >= 0 for v in values)


def _dtype(code: str, name: str, where: str) -> np.dtype:
    if code not in _SAFETENSORS_DTYPES:
        raise ValueError(f"{where}: array {name!r} has the safetensors dtype {code!r}, which fitjax "
                         f"does not read (it reads {sorted(_SAFETENSORS_DTYPES)}).")
    return np.dtype(_SAFETENSORS_DTYPES[code])


def save_safetensors(arrays: Mapping[str, Any], file: str | os.PathLike, metadata: Mapping[str, str] | None = None
                     ) -> None:
    """Writes `{name: array}` as one `.safetensors` file (what `transformers` and `safe_open` read)."""
    codes = {np.dtype(v): k for k, v in _SAFETENSORS_DTYPES.items()}
    header: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
    blobs, offset = [], 0
    for name, value in arrays.items():
        array = np.ascontiguousarray(np.asarray(value))
        if array.dtype not in codes:
            raise ValueError(f"save_safetensors: {name!r} has dtype {array.dtype}, not one safetensors holds "
                             f"({sorted(str(d) for d in codes)}).")
        data = array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": codes[array.dtype], "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    with open(file, "wb") as f:
        f.write(struct.pack("<Q", len(encoded)))
        f.write(encoded)
        for blob in blobs:
            f.write(blob)


# --------------------------------------------------------------------------- arrays in memory

class Arrays(Source):
    """A mapping of arrays, flat (`{"layer.weight": ...}`) or nested; torch tensors are read
    through numpy without a copy where the dtype allows (bfloat16 as ml_dtypes' bfloat16)."""

    def __init__(self, arrays: Mapping[str, Any], description: str):
        self.description = description
        self._arrays = {name: _numpy(value) for name, value in _flat(arrays).items()}

    def entries(self):
        return {name: jax.ShapeDtypeStruct(a.shape, a.dtype) for name, a in self._arrays.items()}

    def read(self, name, index):
        return self._arrays[name][index]


def _flat(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flat(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def _numpy(value: Any) -> np.ndarray:
    if type(value).__module__.startswith("torch"):
        import torch  # only when the user handed torch tensors

        value = value.detach().cpu()
        if value.dtype == torch.bfloat16:
            return value.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return value.numpy()
    return np.asarray(value)


# ---------------------------------------------------------------------------------------- Orbax

class OrbaxTree(Source):
    """A plain Orbax PyTree checkpoint folder, or the weights of a fitjax checkpoint (`params`
    and `model_state` of its `state/` item, named without those prefixes). Arrays kept in their
    layout are read by Orbax straight into their shardings (each process reads its shards);
    transposed ones are read whole, one at a time."""

    def __init__(self, path: Path, description: str, *, roots: tuple[str, ...] = ()):
        import orbax.checkpoint as ocp

        self.description, self._path = description, path
        from etils import epath

        metadata = ocp.PyTreeCheckpointHandler().metadata(epath.Path(path))
        tree = getattr(metadata, "tree", metadata)
        self._keys: dict[str, tuple] = {}
        self._entries: dict[str, jax.ShapeDtypeStruct] = {}
        for key_path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
            keys = tuple(getattr(k, "key", getattr(k, "idx", k)) for k in key_path)
            if roots and keys[0] not in roots:
                continue
            name = ".".join(map(str, keys[1:] if roots else keys))
            self._keys[name] = keys
            self._entries[name] = jax.ShapeDtypeStruct(tuple(leaf.shape), leaf.dtype)

    def entries(self):
        return dict(self._entries)

    def read(self, name, index):
        return self._restore({name: None})[name][index]

    def place(self, placements):
        direct = {p.name: p.target for p in placements if p.perm is None}
        placed = self._restore(direct)
        # a transposed array: read whole on the host (one at a time), then sliced per device
        return [placed[p.name] if p.perm is None else _from_slices(self, p) for p in placements]

    def _restore(self, wanted: dict[str, jax.ShapeDtypeStruct | None]) -> dict[str, Any]:
        """`{name: array}`: into the target's sharding and dtype, or as numpy for None."""
        import orbax.checkpoint as ocp

        if not wanted:
            return {}
        item, args = {}, {}
        for name, target in wanted.items():
            keys = self._keys[name]
            leaf = self._entries[name] if target is None else target
            arg = (ocp.RestoreArgs(restore_type=np.ndarray) if target is None else
                   ocp.ArrayRestoreArgs(sharding=target.sharding, global_shape=target.shape, dtype=target.dtype))
            _nest(item, keys, leaf)
            _nest(args, keys, arg)
        restored = ocp.PyTreeCheckpointer().restore(
            self._path, args=ocp.args.PyTreeRestore(item=item, restore_args=args, partial_restore=True))
        return {name: _get(restored, self._keys[name]) for name in wanted}


def _nest(tree: dict, keys: tuple, value: Any) -> None:
    for key in keys[:-1]:
        tree = tree.setdefault(key, {})
    tree[keys[-1]] = value


def _get(tree: Any, keys: tuple) -> Any:
    for key in keys:
        tree = tree[key]
    return tree


def _indexed_files(index: Path) -> list[Path]:
    """The files `model.safetensors.index.json` lists, each there."""
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        files = sorted(set(weight_map.values()))
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise ValueError(f"{str(index)!r} is no safetensors index ({type(error).__name__}: {error}); it must be "
                         "JSON with a 'weight_map' of tensor name -> file name. Download it again.") from None
    for name in files:
        if not isinstance(name, str) or Path(name).name != name or name in (".", ".."):
            raise ValueError(f"{str(index)!r} lists the file {name!r}; an index names files of its own folder "
                             "(`model-00001-of-00002.safetensors`): a damaged or crafted index.")
        if not (index.parent / name).is_file():
            raise ValueError(f"{str(index)!r} lists the file {name!r}, which is not in the folder: a download "
                             "that did not finish? Download the folder again (`huggingface-cli download NAME "
                             "--local-dir DIR`).")
    return [index.parent / name for name in files]


# ---------------------------------------------------------------------------------- dispatch

_ACCEPTED = ("a `.safetensors` file, a Hugging Face model folder (config.json with model.safetensors, "
             "or sharded ones listed in model.safetensors.index.json), a plain Orbax tree folder, a "
             "fitjax checkpoint folder, a `.msgpack` file of `flax.serialization`, or a mapping "
             "`{name: array}` (a torch `state_dict()`, numpy or jax arrays)")


def open_source(source: Any, *, argument: str = "source") -> Source:
    """The `Source` for what the user passed, or an error saying what is accepted."""
    if isinstance(source, Source):
        return source
    if isinstance(source, Mapping):
        return Arrays(source, "the given arrays")
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"{argument} must be {_ACCEPTED}; got {type(source).__name__}: {source!r}.")
    path = Path(source).expanduser()
    if path.is_file() and path.suffix == ".safetensors":
        return SafetensorsFiles([path], f"safetensors file {str(path)!r}")
    if path.is_file() and path.suffix == ".msgpack":
        from flax import serialization

        return Arrays(serialization.msgpack_restore(path.read_bytes()), f"msgpack file {str(path)!r}")
    if path.is_dir():
        index = path / "model.safetensors.index.json"
        if index.is_file():
            return SafetensorsFiles(_indexed_files(index), f"Hugging Face folder {str(path)!r}")
        files = sorted(path.glob("*.safetensors"))
        if files:
            return SafetensorsFiles(files, f"folder {str(path)!r}")
        if (path / "meta" / "metadata").is_file() and (path / "state").is_dir():
            return OrbaxTree(path / "state", f"fitjax checkpoint {str(path)!r}", roots=("params", "model_state"))
        if any((path / marker).exists() for marker in ("_METADATA", "manifest.ocdbt", "_CHECKPOINT_METADATA")):
            return OrbaxTree(path, f"Orbax tree {str(path)!r}")
    what = "does not exist" if not path.exists() else "is none of these"
    raise ValueError(f"{argument}={str(source)!r} {what}: pass {_ACCEPTED}.")
