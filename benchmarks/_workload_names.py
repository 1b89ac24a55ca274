"""The names of `overhead.py`'s workloads, readable before JAX is imported: `peers.py` and
`techniques.py` offer them as choices and answer `--help` without importing `overhead.py`
(which imports JAX); `overhead.py` checks its table against them."""

WORKLOAD_NAMES = ("mnist_mlp", "small_cnn", "tiny_mlp")  # sorted
