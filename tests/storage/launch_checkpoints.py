"""One process of `fitjax launch --nproc 2 --devices-per-process 4 launch_checkpoints.py OUT_DIR`.

Fits with the three checkpoint callbacks of `test_several_checkpoints._three` under FSDP over both
processes (a state no process holds whole: Orbax's multi-process save) and writes what each
callback kept to OUT_DIR/books_<rank>.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]

import jax  # noqa: E402
from test_several_checkpoints import _books, _fit, _three  # noqa: E402

from fitjax.strategies import FSDP  # noqa: E402

out = Path(sys.argv[1])
callbacks = _three(out / "launched")
_fit(callbacks, strategy=FSDP(data=2, fsdp=4, min_size_to_shard=0))
(out / f"books_{jax.process_index()}.json").write_text(json.dumps([_books(c) for c in callbacks]))
