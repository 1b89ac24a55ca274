"""One process of a 2-process `TextLoader` run on localhost through `jax.distributed`.

Run by tests/data/test_text_shards.py as `python text_worker.py DIR` with JAX_COORDINATOR_ADDRESS
and JAX_PROCESS_ID set; DIR holds `data/`, `tokenizer/` and `state.json` (a 1-process position
to resume from). Writes what this process saw to DIR/process_<id>.pkl.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
from pathlib import Path

import jax

from fitjax.data import _tokenize
from test_text_shards import batches, make

counted = {"records": 0}
_encode = _tokenize.Encoder.__call__


def _counting(self, record, where):
    counted["records"] += 1
    return _encode(self, record, where)


def main(folder: Path) -> None:
    jax.distributed.initialize(os.environ["JAX_COORDINATOR_ADDRESS"], num_processes=2,
                               process_id=int(os.environ["JAX_PROCESS_ID"]))
    _tokenize.Encoder.__call__ = _counting  # the real encoder, counted
    tokenizer = str(folder / "tokenizer")
    loader = make(folder / "data", tokenizer)
    assert loader.local_batch_size == 2
    results = {"epochs": [batches(loader)]}
    results["tokenized"] = counted["records"]
    loader.set_epoch(1)
    results["epochs"].append(batches(loader))
    results["after_epochs"] = counted["records"]
    resumed = make(folder / "data", tokenizer)  # 1 -> 2: a 1-process position
    resumed.load_state_dict(json.loads((folder / "state.json").read_text()))
    results["resumed"] = batches(resumed)
    stopped = make(folder / "data", tokenizer)  # 2 -> 1: this position, after 2 batches
    batches(stopped, stop=2)
    results["state"] = json.loads(json.dumps(stopped.state_dict()))
    with open(folder / f"process_{jax.process_index()}.pkl", "wb") as file:
        pickle.dump(results, file)


if __name__ == "__main__":
    try:
        main(Path(sys.argv[1]))
    except BaseException:
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)  # not sys.exit: jax.distributed's shutdown would wait for the other process
